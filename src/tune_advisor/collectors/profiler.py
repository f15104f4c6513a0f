"""torch.profiler over a few extra training steps of a designated probe, summarised for the rules and the report.

The probe child calls `profile_steps()` after its measured steps, so the profiler never touches the timing.
`TraceProfiler` is the collector (start / step / stop / result); `summarise_trace()` is a stateless analysis of
one parsed Chrome trace (kineto's JSON), so it is tested on synthetic CUDA traces as well as on real CPU ones.

The step-time breakdown follows the TensorBoard profiler plugin's categories: every instant of a step is given
to the first category active then, in the order kernel, memcpy, memset, runtime, data loading, CPU exec; what
is left is "other" (Python between ops, the optimizer's bookkeeping, idle). So the categories add up to the
step time exactly.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

from ..files import write_bytes_atomic

WAIT, WARMUP, ACTIVE = 1, 1, 3  # profiler schedule: one step to settle, one to warm the profiler, three recorded
# A short budget's share for the profiler's steps (`schedule_within`): on a 1-minute run of cnn (1.8 s steps) the
# baseline's five profiled steps took 15 s, a quarter of the minute (benchmarks/results/minute_breakdown.md).
PROFILE_SHARE = 0.05
MAX_TRACE_BYTES = 20 * 2**20  # gzipped; a larger trace is cut to its first step, then dropped
TOP_OPS = 15
CATEGORIES = ("kernel", "memcpy", "memset", "runtime", "data_loading", "cpu_exec", "other")
# Scalar reads (`.item()`, `bool(t)`, ...): on a CUDA tensor each makes the host wait for the device.
SCALAR_READS = ("aten::item", "aten::_local_scalar_dense")
# The runtime calls that block the host until the device is done: these are the syncs that cost on CUDA.
DEVICE_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2")
SYNC_NAMES = SCALAR_READS + DEVICE_SYNCS
# The probe loop's own per step, on CUDA: loss.item() (a stream sync) and torch.cuda.synchronize().
PROBE_DEVICE_SYNCS_PER_STEP = 2
DATA_LOADING_PREFIX = "enumerate(DataLoader)"
# Matrix multiplies, convolutions, attention and recurrent cells: the work a 16-bit type (amp) or TF32 speeds up.
# Host operators on a CPU (wrappers like aten::convolution overlap their kernels' ops; their union is counted),
# kernel names on CUDA (cuBLAS/CUTLASS GEMMs, cuDNN convolutions and RNNs, flash/fused attention).
DENSE_OPS = re.compile(r"^aten::(_?(add)?b?mm|baddbmm|addbmm|_addmm_activation|\w*conv\w*|_scaled_dot_product\w*"
                       r"|\w*rnn\w*|\w*lstm\w*|\w*gru\w*|mkldnn_linear\w*)$")
DENSE_KERNELS = re.compile(r"gemm|conv|xmma|cutlass|flash|fmha|attention|wgrad|dgrad|cudnn|rnn|lstm", re.IGNORECASE)
STEP_PREFIX = "ProfilerStep#"
# torch.optim's annotation of each optimizer.step() (also "Optimizer.step#SGD.step", ...): what a fused optimizer
# could shorten. Its share of a step ranked the fused optimizer's prospect on the shipped fixtures as their probes
# measured it (Intel Xeon, 2 cores): tiny_batch_mlp 83% of the compute, raw_sensor_mlp 35%, augment_cpu 33% (its
# step mostly waits for data), varlen_transformer and lstm_collate 11-13%, hf_transformer 7%, cnn 3%.
OPTIMIZER_PREFIX = "Optimizer.step#"


def schedule_within(step_s: float, left_s: float | None) -> dict[str, int]:
    """The profiler's schedule (wait, warmup, active) for steps of `step_s` with `left_s` of the budget left for the
    probe: the full one (WAIT, WARMUP, ACTIVE) where its steps fit in PROFILE_SHARE of `left_s` or there is no
    budget; else no settling step and as few recorded ones as fit, at least one (the profiler's own warm-up step is
    kept: the first profiled step pays its start)."""
    full = {"wait": WAIT, "warmup": WARMUP, "active": ACTIVE}
    if left_s is None or not step_s > 0:
        return full
    fit = int(PROFILE_SHARE * left_s // step_s)
    if fit >= WAIT + WARMUP + ACTIVE:
        return full
    return {"wait": 0, "warmup": WARMUP, "active": max(1, min(ACTIVE, fit - WARMUP))}


class TraceProfiler:
    """torch.profiler with a wait/warm-up/active schedule; the trace is gzipped to `trace_path`."""

    def __init__(self, device_type: str, trace_path: Path | None, wait: int = WAIT, warmup: int = WARMUP,
                 active: int = ACTIVE, max_trace_bytes: int = MAX_TRACE_BYTES):
        self.device_type, self.trace_path = device_type, trace_path
        self.wait, self.warmup, self.active = wait, warmup, active
        self.max_trace_bytes = max_trace_bytes
        self._prof = None
        self._raw_path: Path | None = None
        self._top: dict[str, list] = {}
        self._summary: dict[str, Any] | None = None

    @property
    def steps(self) -> int:
        """Steps to run between start() and stop()."""
        return self.wait + self.warmup + self.active

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if self.device_type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, on_trace_ready=self._ready,
                             schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1))
        self._prof.__enter__()

    def step(self) -> None:
        """Call after each training step."""
        self._prof.step()

    def stop(self) -> None:
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            self._prof = None

    def _ready(self, prof) -> None:
        """Called by torch.profiler when the active steps are recorded: keep the operator table and the trace."""
        self._top = top_operators(prof.key_averages(), self.active)
        folder = self.trace_path.parent if self.trace_path is not None else None  # None: the system's temp folder
        fd, name = tempfile.mkstemp(prefix="trace-", suffix=".raw.json", dir=folder)
        os.close(fd)
        self._raw_path = Path(name)
        prof.export_chrome_trace(name)

    def result(self) -> dict[str, Any]:
        """The probe's `extra.profile` object (raises when the profiler recorded nothing)."""
        if self._summary is not None:
            return self._summary
        if self._raw_path is None or not self._raw_path.exists():
            raise RuntimeError("the profiler recorded no trace (fewer steps than its schedule?)")
        try:
            trace = json.loads(self._raw_path.read_text())
            summary = summarise_trace(trace, self.device_type)
            summary.update(self._top)
            summary["schedule"] = {"wait": self.wait, "warmup": self.warmup, "active": self.active}
            summary["trace"] = write_trace(trace, self.trace_path, self.max_trace_bytes, summary.get("steps"))
        finally:
            self._raw_path.unlink(missing_ok=True)
        self._summary = summary
        return summary


def profile_steps(run_step: Callable[[int], Any], device_type: str, trace_path: Path | None,
                  **schedule: int) -> dict[str, Any]:
    """Run `run_step(i)` for the schedule's steps under the profiler; return the `extra.profile` summary."""
    profiler = TraceProfiler(device_type, trace_path, **schedule)
    profiler.start()
    try:
        for i in range(profiler.steps):
            run_step(i)
            profiler.step()
    finally:
        profiler.stop()
    return profiler.result()


# --- analyses ---------------------------------------------------------------------------------------------------


def top_operators(averages, steps: int, limit: int = TOP_OPS) -> dict[str, list]:
    """Operators by self time per step, host and device, from `prof.key_averages()`.

    Ranges from record_function (the profiler's step markers, the DataLoader's and optimizer's annotations)
    are not operators and are left out.
    """
    ops = [a for a in averages if not getattr(a, "is_user_annotation", False)
           and not str(a.key).startswith("ProfilerStep")]

    def row(a, self_us: float) -> dict[str, Any]:
        return {"name": a.key, "calls_per_step": a.count / steps, "self_s_per_step": self_us / 1e6 / steps}

    host = sorted(ops, key=lambda a: -a.self_cpu_time_total)
    device = sorted((a for a in ops if getattr(a, "self_device_time_total", 0) > 0),
                    key=lambda a: -a.self_device_time_total)
    return {"top_ops_host": [row(a, a.self_cpu_time_total) for a in host[:limit] if a.self_cpu_time_total > 0],
            "top_ops_device": [row(a, a.self_device_time_total) for a in device[:limit]]}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in _union(intervals))


def _clip(intervals, start: float, end: float) -> list[tuple[float, float]]:
    return [(max(a, start), min(b, end)) for a, b in intervals if b > start and a < end]


def _category(event: dict[str, Any]) -> str | None:
    cat = (event.get("cat") or "").lower()
    name = event.get("name") or ""
    if cat == "kernel":
        return "kernel"
    if cat == "gpu_memcpy":
        return "memcpy"
    if cat == "gpu_memset":
        return "memset"
    if cat in ("cuda_runtime", "cuda_driver"):
        return "runtime"
    if cat == "user_annotation" and name.startswith(DATA_LOADING_PREFIX):
        return "data_loading"
    if cat == "cpu_op":
        return "cpu_exec"
    return None


def summarise_trace(trace: dict[str, Any], device_type: str = "cpu") -> dict[str, Any]:
    """Step breakdown, device idle share, kernel and copy statistics and sync calls from a parsed Chrome trace.

    Times in the trace are microseconds; the summary is in seconds, per profiled step.
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)
                    and (e.get("cat") or "").lower() == "user_annotation"), key=lambda e: e["ts"])
    if not steps:
        raise RuntimeError("the trace has no ProfilerStep markers")
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        c = _category(e)
        if c:
            by_cat[c].append(e)
    device_events = by_cat["kernel"] + by_cat["memcpy"] + by_cat["memset"]

    # A step's window runs from its host marker to the end of the device work launched before the next step.
    windows = []
    for i, s in enumerate(steps):
        start, end = s["ts"], s["ts"] + s["dur"]
        next_start = steps[i + 1]["ts"] if i + 1 < len(steps) else float("inf")
        tail = [e["ts"] + e["dur"] for e in device_events if start <= e["ts"] < next_start]
        windows.append((start, max([end, *tail])))
    n = len(windows)
    step_total = sum(b - a for a, b in windows)

    def in_steps(es: list[dict]) -> list[tuple[float, float]]:
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in es]
        return [iv for a, b in windows for iv in _clip(spans, a, b)]

    breakdown: dict[str, float] = {}
    covered: list[tuple[float, float]] = []
    for name in CATEGORIES[:-1]:
        spans = in_steps(by_cat[name])
        before = _length(covered)
        covered = _union(covered + spans)
        breakdown[name] = (_length(covered) - before)
    breakdown["other"] = max(0.0, step_total - _length(covered))

    def inside(e) -> bool:
        return any(a <= e["ts"] < b for a, b in windows)

    kernels = [e for e in by_cat["kernel"] if inside(e)]
    copies = [e for e in by_cat["memcpy"] if inside(e)]
    cuda = device_type == "cuda"
    h2d = {"pageable": 0, "pinned": 0}
    for e in copies:
        name = e.get("name", "").lower()  # kineto: "Memcpy HtoD (Pageable -> Device)"; some builds say "Pagable"
        if "htod" in name:
            kind = "pinned" if "(pinned" in name else "pageable" if "(pag" in name else None
            if kind:
                h2d[kind] += int((e.get("args") or {}).get("bytes", 0))
    syncs = Counter(e["name"] for e in events if e.get("name") in SYNC_NAMES and inside(e))
    top_level_ops = _top_level([e for e in by_cat["cpu_exec"] if inside(e)])
    kernel_s = sum(e["dur"] for e in kernels) / 1e6
    loading = in_steps(by_cat["data_loading"])
    dense = [e for e in kernels if DENSE_KERNELS.search(e["name"])] if cuda else \
        [e for e in by_cat["cpu_exec"] if DENSE_OPS.match(e["name"]) and inside(e)
         and not any(a <= e["ts"] < b for a, b in loading)]
    compute = step_total - breakdown["data_loading"]
    optimizer = _optimizer_s(events, kernels, by_cat["runtime"], in_steps) if cuda else \
        _length(in_steps([e for e in events if str(e.get("name", "")).startswith(OPTIMIZER_PREFIX)]))
    device_syncs = sum(syncs.get(name, 0) for name in DEVICE_SYNCS) / n

    return {
        "steps": n,
        "step_time_s": step_total / n / 1e6,
        "breakdown_s": {k: v / n / 1e6 for k, v in breakdown.items()},
        "breakdown_frac": {k: v / step_total if step_total else None for k, v in breakdown.items()},
        "device_idle_frac": (1 - _length(in_steps(device_events)) / step_total) if cuda and step_total else None,
        "kernels_per_step": len(kernels) / n if cuda else None,
        "kernel_mean_s": kernel_s / len(kernels) if kernels else None,
        "top_kernels": _top_by_name(kernels, n) if cuda else [],
        "ops_per_step": top_level_ops / n,
        # Of the step outside data loading: the share that lower precision can speed up (DENSE_OPS).
        "dense_frac": min(1.0, _length(in_steps(dense)) / compute) if compute > 0 else None,
        # Of the same: the optimizer's step (`_optimizer_s`), a fixed cost per step whatever the batch.
        "optimizer_frac": min(1.0, optimizer / compute) if compute > 0 else None,
        "h2d_pageable_bytes": h2d["pageable"] / n if cuda else None,
        "h2d_pinned_bytes": h2d["pinned"] / n if cuda else None,
        "memcpy_per_step": len(copies) / n if cuda else None,
        "sync_calls_per_step": {k: v / n for k, v in sorted(syncs.items())},
        "device_syncs_per_step": device_syncs if cuda else None,
        # Beyond the probe loop's own two: each stalls the host until the device has caught up.
        "user_device_syncs_per_step": max(0.0, device_syncs - PROBE_DEVICE_SYNCS_PER_STEP) if cuda else None,
    }


def _optimizer_s(events: list[dict], kernels: list[dict], runtime: list[dict], in_steps) -> float:
    """The optimizer steps' time in the profiled steps on CUDA: their host spans or the kernels launched from
    inside them (matched by the launch's correlation id), whichever is longer: a host-bound step waits for the
    launches, a device-bound one for the kernels, and a fused optimizer shortens both."""
    host = in_steps([e for e in events if str(e.get("name", "")).startswith(OPTIMIZER_PREFIX)])
    launched = {(e.get("args") or {}).get("correlation") for e in runtime
                if any(a <= e["ts"] < b for a, b in host)} - {None}
    device = in_steps([e for e in kernels if (e.get("args") or {}).get("correlation") in launched])
    return max(_length(host), _length(device))


def _top_level(ops: list[dict]) -> int:
    """Operators not nested in another operator on the same thread (what the Python code called)."""
    count = 0
    for _, group in _by_thread(ops).items():
        end = -float("inf")
        for e in sorted(group, key=lambda e: (e["ts"], -e["dur"])):
            if e["ts"] >= end:
                count += 1
                end = e["ts"] + e["dur"]
    return count


def _by_thread(events: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        groups[(e.get("pid"), e.get("tid"))].append(e)
    return groups


def _top_by_name(events: list[dict], steps: int, limit: int = TOP_OPS) -> list[dict[str, Any]]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        totals[e["name"]][0] += 1
        totals[e["name"]][1] += e["dur"]
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:limit]
    return [{"name": k, "calls_per_step": c / steps, "self_s_per_step": d / 1e6 / steps} for k, (c, d) in ranked]


# --- the trace file ---------------------------------------------------------------------------------------------


def write_trace(trace: dict[str, Any], path: Path | None, max_bytes: int = MAX_TRACE_BYTES,
                steps: int | None = None) -> dict[str, Any]:
    """Gzip the trace to `path` (Perfetto and chrome://tracing open it); over `max_bytes`, keep only the first
    profiled step; still over, keep nothing. Returns the `extra.profile.trace` record."""
    if path is None:
        return {"file": None, "bytes": None, "truncated": False, "note": "no trace file requested"}
    data = gzip.compress(json.dumps(trace).encode(), compresslevel=6)
    truncated, note = False, None
    if len(data) > max_bytes:
        full = len(data)
        data = gzip.compress(json.dumps(first_step_only(trace)).encode(), compresslevel=6)
        truncated = True
        note = f"the trace of {steps or '?'} steps was {full / 2**20:.1f} MiB gzipped, over the " \
               f"{max_bytes / 2**20:.0f} MiB cap: kept only the first profiled step"
        if len(data) > max_bytes:
            return {"file": None, "bytes": None, "truncated": True,
                    "note": f"even one step's trace is {len(data) / 2**20:.1f} MiB gzipped, over the "
                            f"{max_bytes / 2**20:.0f} MiB cap: not kept"}
    write_bytes_atomic(path, data)
    return {"file": path.name, "bytes": len(data), "truncated": truncated, "note": note}


def first_step_only(trace: dict[str, Any]) -> dict[str, Any]:
    """The trace with only the metadata and the events of its first ProfilerStep (device work included)."""
    events = trace.get("traceEvents", [])
    steps = sorted((e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX) and "dur" in e),
                   key=lambda e: e["ts"])
    if not steps:
        return {**trace, "traceEvents": [e for e in events if e.get("ph") == "M"]}
    start = steps[0]["ts"]
    end = steps[1]["ts"] if len(steps) > 1 else steps[0]["ts"] + steps[0]["dur"]
    kept = [e for e in events if e.get("ph") == "M" or ("ts" in e and start <= float(e["ts"]) < end)]
    return {**trace, "traceEvents": kept}
