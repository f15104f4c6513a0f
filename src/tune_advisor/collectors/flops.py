"""FLOPs per training step, the device's measured peak FLOP/s per dtype, and MFU (achieved over peak).

FLOPs are counted by torch's `FlopCounterMode` on one forward+backward outside the timed steps (matmuls,
convolutions, attention; elementwise work and the optimizer are not counted, as in every MFU figure; a
checkpointed model's recomputed forward is counted, since it really runs).

The roof is measured, not taken from a datasheet: the best rate of a large matmul per dtype on the probe's
device, once per machine, in a process of its own (`ensure_peaks`, or `python -m tune_advisor.collectors.flops
DEVICE`) so that neither its memory nor its time lands in a probe. Results are cached in
`$XDG_CACHE_HOME/tune-advisor/peaks.json` (default `~/.cache/...`) keyed by the hardware fingerprint, the
device and the intra-op thread count; probe children only read the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

CACHE_SCHEMA = 1
CPU_SIZE = 2048  # fp32: 17 GFLOP a matmul, tens of ms on a few cores; large enough to reach the BLAS plateau
CUDA_SIZE = 8192  # 1.1 TFLOP a matmul: milliseconds on a current GPU, far past launch overhead
MIN_TIME_S = 0.4  # per dtype, after one warm-up matmul
MAX_REPS = 50
PEAK_TIMEOUT_S = 300.0


# --- FLOPs per step ---------------------------------------------------------------------------------------------


def count_flops(run: Callable[[], Any]) -> int:
    """FLOPs of the aten ops that `run()` executes (forward+backward of one step, when that is what it does)."""
    return sum(count_flops_by_op(run).values())


def count_flops_by_op(run: Callable[[], Any]) -> dict[str, int]:
    """FLOPs of `run()` per aten op ("aten.addmm", "aten.convolution_backward", ...)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run()
    return {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}


def conv_share(by_op: dict[str, int]) -> float:
    """Share of the FLOPs in convolutions (cuDNN decides their TF32 use apart from the matmuls')."""
    total = sum(by_op.values())
    return sum(n for op, n in by_op.items() if "conv" in op) / total if total else 0.0


def compute_dtype(amp: str, device: str, conv_frac: float = 0.0) -> str:
    """The dtype a probe's matmuls and convolutions run in, hence whose roof its MFU is measured against.

    Under amp, the amp dtype. In fp32 on an Ampere+ GPU, matmuls run as TF32 when the float32 matmul precision
    allows it (off by default) and convolutions when cuDNN's TF32 switch is on (on by default): the roof is
    TF32's when most FLOPs (`conv_frac` of them in convolutions) run that way. Call this in the probe child,
    after the settings are applied.
    """
    if amp in ("bf16", "fp16"):
        return amp
    if device.startswith("cuda"):
        import torch

        major, _ = torch.cuda.get_device_capability(torch.device(device))
        if major >= 8:
            tf32 = ((1 - conv_frac) * bool(torch.backends.cuda.matmul.allow_tf32)
                    + conv_frac * bool(torch.backends.cudnn.allow_tf32))
            if tf32 > 0.5:
                return "tf32"
    return "fp32"


def summarise(per_step: float, step_median_s: float | None, peaks: dict[str, float] | None,
              dtype: str) -> dict[str, Any]:
    """The probe's `extra.flops` object."""
    achieved = per_step / step_median_s if step_median_s else None
    peak = (peaks or {}).get(dtype)
    return {
        "per_step": per_step,
        "achieved_flops_per_s": achieved,
        "peak_flops_per_s": peak,
        "peak_dtype": dtype,
        "mfu": achieved / peak if achieved is not None and peak else None,
        "peaks": dict(peaks) if peaks else None,
    }


# --- measured peaks ---------------------------------------------------------------------------------------------


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tune-advisor" / "peaks.json"


def peak_key(device: str) -> str:
    """Fingerprint of what sets the roof: the machine and torch (environment.fingerprint), the device and, on
    the CPU, the intra-op thread count."""
    import torch

    from .. import environment

    key = f"{environment.collect(device)['fingerprint']}/{device}"
    return key if device.startswith("cuda") else f"{key}/threads={torch.get_num_threads()}"


def cached_peaks(device: str, key: str | None = None) -> dict[str, float] | None:
    """{dtype: FLOP/s} from the cache for this machine, or None."""
    try:
        entry = json.loads(cache_path().read_text())["peaks"][key or peak_key(device)]
        return {k: float(v) for k, v in entry["flops_per_s"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_peaks(key: str, device: str, peaks: dict[str, float], method: str) -> None:
    """Merge one machine's peaks into the cache file (atomically: a temporary file, then a rename)."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        doc = json.loads(path.read_text())
        if doc.get("schema") != CACHE_SCHEMA:
            raise ValueError
    except (OSError, ValueError):
        doc = {"schema": CACHE_SCHEMA, "peaks": {}}
    doc["peaks"][key] = {"device": device, "flops_per_s": peaks, "method": method,
                         "measured": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def peak_dtypes(device: str) -> list[str]:
    import torch

    if not device.startswith("cuda"):
        return ["fp32", "bf16"]
    major, _ = torch.cuda.get_device_capability(torch.device(device))
    dtypes = ["fp32", "fp16"]
    if major >= 8:
        dtypes.append("tf32")
    if torch.cuda.is_bf16_supported():
        dtypes.append("bf16")
    return dtypes


def measure_peaks(device: str, size: int | None = None, min_time_s: float = MIN_TIME_S) -> dict[str, float]:
    """Best FLOP/s of an n×n by n×n matmul per dtype on `device`, in this process."""
    import torch

    cuda = device.startswith("cuda")
    n = size or (CUDA_SIZE if cuda else CPU_SIZE)
    dtypes = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    peaks = {}
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    try:
        for name in peak_dtypes(device):
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            a = torch.randn(n, n, device=device, dtype=dtypes[name])
            b = torch.randn(n, n, device=device, dtype=dtypes[name])
            best = _best_matmul_s(a, b, cuda, min_time_s)
            peaks[name] = 2 * n**3 / best
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    return peaks


def _best_matmul_s(a, b, cuda: bool, min_time_s: float) -> float:
    import torch

    torch.mm(a, b)  # warm-up: BLAS/cuBLAS handle set-up, AMX tile configuration, clocks ramping up
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - started < min_time_s and len(times) < MAX_REPS):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            torch.mm(a, b)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1000)
        else:
            t0 = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - t0)
    return min(times)


def ensure_peaks(device: str, timeout_s: float = PEAK_TIMEOUT_S) -> tuple[dict[str, float] | None, str]:
    """The cached peaks of `device` on this machine, measuring them first (in a child process) when missing.

    Returns (peaks or None, a status line). Never raises: MFU is an extra, not a reason to stop an analysis.
    """
    try:
        key = peak_key(device)
        peaks = cached_peaks(device, key)
        if peaks:
            return peaks, f"ok: cached in {cache_path()}"
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        done = subprocess.run([sys.executable, "-m", "tune_advisor.collectors.flops", device, "--key", key],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
        peaks = cached_peaks(device, key)
        if peaks:
            return peaks, f"ok: measured into {cache_path()}"
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"error: measuring the peak failed ({tail[0][:200]})"
    except subprocess.TimeoutExpired:
        return None, f"error: measuring the peak took over {timeout_s:g} s"
    except Exception as exc:  # e.g. an unwritable cache folder
        return None, f"error: {type(exc).__name__}: {exc}"


def main(argv: list[str]) -> int:
    """`python -m tune_advisor.collectors.flops DEVICE [--key KEY]`: measure, cache and print the peaks."""
    device = argv[0] if argv else "cpu"
    key = argv[argv.index("--key") + 1] if "--key" in argv else peak_key(device)
    peaks = measure_peaks(device)
    n = CUDA_SIZE if device.startswith("cuda") else CPU_SIZE
    store_peaks(key, device, peaks, f"best of torch.mm {n}x{n} per dtype")
    print(json.dumps({"key": key, "flops_per_s": peaks}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
