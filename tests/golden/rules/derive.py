"""Derive the synthetic golden documents from real CPU runs (tests/golden/cnn.results.json and
compile_varlen.results.json).

The CUDA-only rules cannot fire on this CPU machine, and torch.compile does not change this model's loss, so these
documents are hand-made: every change to the real document is listed in its "_synthetic" key. Their numbers are not
measurements; real-GPU checks come later.

    python tests/golden/rules/derive.py      # rewrites synthetic_*.results.json next to this file
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tune_advisor.probe.result import ProbeResult

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "cnn.results.json"
COMPILE_SOURCE = HERE.parent / "compile_varlen.results.json"
GIB = 2**30


def gpu_env(doc: dict, name: str, memory: int) -> None:
    doc["environment"].update(device="cuda", device_name=name, gpu={
        "name": name, "driver": "550.54.15", "memory_total_bytes": memory, "capability": "8.0", "cuda": "12.4",
        "bf16_supported": True})


def rewrite(probe: dict, step_scale: float = 1.0, h2d_share: float | None = None, loss_scale: float = 1.0) -> dict:
    """Scale a probe's raw samples and recompute its summary fields the way the runner does."""
    result = ProbeResult.from_dict(probe)
    result.raw["step_s"] = [t * step_scale for t in result.step_s]
    if h2d_share is not None:
        result.raw["h2d_s"] = [t * h2d_share for t in result.step_s]
    result.raw["loss"] = [x * loss_scale if x is not None else None for x in result.raw.get("loss", [])]
    return {**probe, **result.to_dict()}


def by_id(doc: dict) -> dict[str, dict]:
    return {p["id"]: p for p in doc["probes"]}


def finish(doc: dict, changes: list[str]) -> dict:
    probes = by_id(doc)
    doc["baseline"] = probes[doc["baseline"]["id"]]
    doc["recommended"] = probes[doc["recommended"]["id"]]
    doc["_synthetic"] = changes
    return doc


def untuned(real: dict) -> dict:
    """An A100 run with pin_memory, cudnn.benchmark and TF32 off, clocks throttled, and AMP changing the loss."""
    doc = copy.deepcopy(real)
    gpu_env(doc, "NVIDIA A100-SXM4-40GB", 40 * GIB)
    baseline_settings = doc["baseline"]["settings"]
    for i, p in enumerate(doc["probes"]):
        if p["status"] == "ok":
            p["gpu"] = {"throttle_reasons": ["sw_thermal_slowdown"], "sm_clock_mhz": 1095, "max_sm_clock_mhz": 1410}
            p["extra"].update(input_shapes_static=True, distinct_input_shapes=1)
            if p["settings"] == baseline_settings:
                doc["probes"][i] = rewrite(p, h2d_share=0.15)
        if p["id"] == "p002":
            doc["probes"][i] = rewrite(p, loss_scale=1.3)
    base = by_id(doc)["p001"]
    for i, p in enumerate(doc["probes"]):
        if p["role"] == "knob:cudnn_benchmark":
            doc["probes"][i] = rewrite({**base, "id": p["id"], "role": p["role"], "settings": p["settings"]},
                                       step_scale=0.85)
        if p["role"] == "knob:pin_memory":
            doc["probes"][i] = rewrite({**base, "id": p["id"], "role": p["role"], "settings": p["settings"]},
                                       step_scale=0.88, h2d_share=0.02)
    return finish(doc, [
        "environment: device cuda, gpu NVIDIA A100-SXM4-40GB (40 GiB, capability 8.0, bf16)",
        "every ok probe: gpu.throttle_reasons [sw_thermal_slowdown], SM clock 1095 of 1410 MHz; "
        "extra.input_shapes_static true",
        "probes at the baseline settings: raw.h2d_s set to 15% of each step",
        "p002 (amp=bf16): raw.loss scaled by 1.3",
        "knob:cudnn_benchmark probe: p001's samples with step times x0.85, status ok",
        "knob:pin_memory probe: p001's samples with step times x0.88 and h2d 2% of each step, status ok",
    ])


def fp16_dynamic(real: dict) -> dict:
    """A 6-GiB-class GPU run with fp16, cudnn.benchmark on over varying shapes, near its memory limit, an OOM and a
    diverged probe, and anomaly detection left on."""
    doc = copy.deepcopy(real)
    tuned = {"pin_memory": True, "cudnn_benchmark": True, "matmul_precision": "high"}
    for p in doc["probes"]:
        if p["role"] == "knob:pin_memory":
            continue  # stays a skipped probe at pin_memory=False
        p["settings"].update(tuned, amp="fp16" if p["settings"]["amp"] == "off" else p["settings"]["amp"])
        if p["status"] == "ok":
            p["peak_memory_bytes"] *= 10
            p["gpu"] = {"throttle_reasons": ["gpu_idle"], "sm_clock_mhz": 1560, "max_sm_clock_mhz": 1560}
            p["extra"].update(input_shapes_static=False, distinct_input_shapes=9, anomaly_detection=True)
    probes = by_id(doc)
    for p in doc["probes"]:  # the CUDA allocator's peak does not count loader workers, as the CPU's RSS did
        if p["status"] == "ok" and p["settings"]["num_workers"]:
            p["peak_memory_bytes"] = next(q["peak_memory_bytes"] for q in doc["probes"] if q["status"] == "ok"
                                          and q["settings"] == {**p["settings"], "num_workers": 0})
    doc["recommended"] = probes["p007"]
    for i, p in enumerate(doc["probes"]):
        if p["role"] == "knob:cudnn_benchmark":
            doc["probes"][i] = rewrite({**probes["p001"], "id": p["id"], "role": p["role"],
                                        "settings": {**probes["p001"]["settings"], "cudnn_benchmark": False}},
                                       step_scale=0.82)
    gpu_env(doc, "NVIDIA RTX A2000", int(max(p["peak_memory_bytes"] or 0 for p in doc["probes"]) / 0.93))
    failed = {"throughput": {"median": None, "ci_low": None, "ci_high": None, "unit": "samples/s"},
              "step_time_s": {"median": None, "iqr": None, "samples": []}, "data_wait_frac": None,
              "peak_memory_bytes": None, "gpu": None, "raw": {}, "memory": {}, "applied": {}, "extra": {}, "seed": 0}
    doc["probes"].append({**failed, "id": "p020", "role": "ladder:batch_size",
                          "settings": {**probes["p001"]["settings"], "batch_size": 128}, "status": "oom",
                          "error": "CUDA out of memory. Tried to allocate 1.50 GiB", "wall_s": 4.1,
                          "loss": {"first": None, "last": None, "finite": None}})
    doc["probes"].append({**failed, "id": "p021", "role": "combine",
                          "settings": {**probes["p013"]["settings"], "amp": "fp16"}, "status": "diverged",
                          "error": "loss became nan at step 7", "wall_s": 3.2,
                          "loss": {"first": 2.45, "last": None, "finite": False}})
    return finish(doc, [
        "environment: device cuda, gpu NVIDIA RTX A2000 (memory: the largest peak / 0.93, bf16)",
        "recommended: p007 (batch_size=64 at the baseline's other settings)",
        "every probe but knob:pin_memory: pin_memory, cudnn_benchmark on, matmul_precision high, amp off -> fp16",
        "every ok probe: peak_memory_bytes x10, with loader workers: that of the same settings without; "
        "gpu.throttle_reasons [gpu_idle] only; extra.input_shapes_static false (9 shapes), "
        "extra.anomaly_detection true",
        "knob:cudnn_benchmark probe: p001's samples with cudnn_benchmark off and step times x0.82, status ok",
        "added p020: batch_size=128 at the baseline settings, status oom",
        "added p021: p013's settings with amp=fp16, status diverged",
    ])


def compile_loss(real: dict) -> dict:
    """The compiled probes' losses scaled by 1.2, as if compilation had changed the arithmetic."""
    doc = copy.deepcopy(real)
    changed = []
    for i, p in enumerate(doc["probes"]):
        if p["status"] == "ok" and p["settings"].get("compile", "off") != "off":
            doc["probes"][i] = rewrite(p, loss_scale=1.2)
            changed.append(p["id"])
    return finish(doc, [f"{', '.join(changed)} (compile on): raw.loss scaled by 1.2"])


def unsupported_op(real: dict) -> dict:
    """One more probe, p077: the baseline's settings with amp=bf16, failed for want of a bf16 kernel."""
    doc = copy.deepcopy(real)
    p = copy.deepcopy(doc["probes"][0])
    p.update(id="p077", role="knob:amp", status="unsupported", settings={**p["settings"], "amp": "bf16"},
             error="LSTM (in Tagger) has no kernel here for amp=bf16: could not create a primitive descriptor for "
                   "the LSTM forward propagation primitive (lstm_collate.py:41 in forward)",
             throughput={"median": None, "ci_low": None, "ci_high": None, "unit": p["throughput"]["unit"]},
             step_time_s={"median": None, "iqr": None, "samples": []}, raw={}, data_wait_frac=None)
    doc["probes"].append(p)
    return finish(doc, ["added p077: the baseline's settings with amp=bf16, status unsupported (no bf16 LSTM)"])


def main() -> None:
    real = json.loads(SOURCE.read_text())
    for name, make in (("synthetic_cuda_untuned", untuned), ("synthetic_cuda_fp16_dynamic", fp16_dynamic),
                       ("synthetic_unsupported_op", unsupported_op)):
        (HERE / f"{name}.results.json").write_text(json.dumps(make(real), indent=1, allow_nan=False) + "\n")
    compiled = json.loads(COMPILE_SOURCE.read_text())
    (HERE / "synthetic_compile_loss.results.json").write_text(
        json.dumps(compile_loss(compiled), indent=1, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
