"""FLOPs per training step, the device's measured peak FLOP/s per dtype, and MFU (achieved over peak).

FLOPs are counted by torch's `FlopCounterMode` on one forward+backward outside the timed steps (matmuls,
convolutions, attention; elementwise work and the optimizer are not counted, as in every MFU figure; a
checkpointed model's recomputed forward is counted, since it really runs).

The roof is measured, not taken from a datasheet: the best rate of square matmuls per dtype on the probe's device,
once per machine, in a process of its own (`ensure_peaks`, or `python -m tune_advisor.collectors.flops DEVICE`) so
that neither its memory nor its time lands in a probe. Each dtype's matmul starts small and doubles while the next
size fits its few seconds, so a slow machine or dtype ends small instead of stalling. Only the dtypes the device
computes natively are measured (`hardware.native_types`); the others, and any the calibration could not finish,
are recorded with the reason (`peak_gaps`), which the probes' `extra.flops.mfu_unavailable` then shows. Results are
cached in `$XDG_CACHE_HOME/tune-advisor/peaks.json` (default `~/.cache/...`) keyed by the hardware fingerprint,
the device and the intra-op thread count, failures included, so a calibration that failed is not rerun on every
analysis; probe children only read the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .. import environment, hardware
from ..files import write_text_atomic

CACHE_SCHEMA = 1
START_SIZE = {"cpu": 256, "cuda": 1024}  # 24 ms for bf16 emulated at 1.4 GFLOP/s (an AVX2-only Zen CPU)
MAX_SIZE = {"cpu": 4096, "cuda": 16384}  # for many-core CPUs and large GPUs; fp32 operands: 192 MiB and 3 GiB
PER_DTYPE_S = 3.0  # each dtype's roof is measured within about this long
MIN_TIME_S = 0.2  # each size is timed at least this long (and MIN_REPS times), when MAX_REPS and time allow
PLATEAU_GAIN = 1.05  # a size whose rate beats the smaller sizes' best by less has reached the BLAS plateau
MIN_REPS = 3
MAX_REPS = 50
PEAK_TIMEOUT_S = 15.0  # the whole calibration, Python and torch start-up included
EXIT_MARGIN_S = 0.5  # of the calibration's time, kept for writing the cache before its deadline
RETRY_FACTOR = 2.0  # a calibration that ran out of time is rerun only when given this many times longer
OUT_OF_TIME = "not measured: no time left"  # how a dtype the calibration had no time for is recorded
TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}

# one n x n matmul of `dtype` on the device: n -> its seconds
MatmulTimer = Callable[[int], float]


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
              dtype: str, gaps: dict[str, str] | None = None) -> dict[str, Any]:
    """The probe's `extra.flops` object. `gaps` (`peak_gaps`) says why a dtype has no roof: then `mfu` is None and
    `mfu_unavailable` tells why."""
    achieved = per_step / step_median_s if step_median_s else None
    peak = (peaks or {}).get(dtype)
    mfu = achieved / peak if achieved is not None and peak else None
    if mfu is not None:
        unavailable = None
    elif achieved is None:
        unavailable = "no measured step time"
    else:
        unavailable = mfu_unavailable(dtype, gaps)
    return {
        "per_step": per_step,
        "achieved_flops_per_s": achieved,
        "peak_flops_per_s": peak,
        "peak_dtype": dtype,
        "mfu": mfu,
        "mfu_unavailable": unavailable,
        "peaks": dict(peaks) if peaks else None,
    }


def mfu_unavailable(dtype: str, gaps: dict[str, str] | None) -> str:
    """Why there is no MFU against `dtype`'s roof, in words for the report."""
    gap = (gaps or {}).get(dtype)
    if gap:
        return f"{dtype} peak {gap}"
    return f"no measured {dtype} peak for this machine (`tune-advisor env --measure-peaks` measures it)"


# --- the peak cache ---------------------------------------------------------------------------------------------


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tune-advisor" / "peaks.json"


def peak_key(device: str) -> str:
    """Fingerprint of what sets the roof: the machine and torch (environment.fingerprint), the device and, on
    the CPU, the intra-op thread count."""
    import torch

    key = f"{environment.collect(device)['fingerprint']}/{device}"
    return key if device.startswith("cuda") else f"{key}/threads={torch.get_num_threads()}"


def cached_entry(device: str, key: str | None = None) -> dict[str, Any] | None:
    """This machine's cache entry ({device, flops_per_s, gaps, sizes, method, measured, incomplete, ...}), or None."""
    try:
        entry = json.loads(cache_path().read_text())["peaks"][key or peak_key(device)]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return entry if isinstance(entry, dict) else None


def cached_peaks(device: str, key: str | None = None) -> dict[str, float] | None:
    """{dtype: FLOP/s} from the cache for this machine, or None."""
    return _peaks_of(cached_entry(device, key))


def peak_gaps(device: str, key: str | None = None) -> dict[str, str]:
    """{dtype: why it has no roof} from the cache for this machine: "skipped: <why it is not native>" or
    "not measured: <why the calibration did not finish it>"; {} when nothing is cached."""
    return _gaps_of(cached_entry(device, key))


def peak_status(device: str, key: str | None = None) -> tuple[dict[str, float] | None, str | None]:
    """(peaks or None, a status line) from the cache alone; (None, None) when this machine has no entry."""
    entry = cached_entry(device, key)
    return (None, None) if entry is None else _answer(entry, f"cached in {cache_path()}", cached=True)


def store_peaks(key: str, device: str, peaks: dict[str, float], method: str, gaps: dict[str, str] | None = None,
                **facts: Any) -> None:
    """Merge one machine's peaks, and why the others are missing (`gaps`), into the cache file (atomically).
    `incomplete`: a dtype the calibration meant to measure has no roof."""
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        doc = json.loads(path.read_text())
        if doc.get("schema") != CACHE_SCHEMA or not isinstance(doc.get("peaks"), dict):
            raise ValueError
    except (OSError, ValueError, AttributeError):
        doc = {"schema": CACHE_SCHEMA, "peaks": {}}
    gaps = {k: v for k, v in (gaps or {}).items() if k not in peaks}
    doc["peaks"][key] = {"device": device, "flops_per_s": peaks, "gaps": gaps, "method": method,
                         "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         "incomplete": any(not why.startswith("skipped") for why in gaps.values()), **facts}
    write_text_atomic(path, json.dumps(doc, indent=1))  # not strict JSON: a cached NaN reads back as before


def _peaks_of(entry: dict[str, Any] | None) -> dict[str, float] | None:
    try:
        peaks = {str(k): float(v) for k, v in ((entry or {}).get("flops_per_s") or {}).items()}
    except (AttributeError, TypeError, ValueError):
        return None
    return peaks or None


def _gaps_of(entry: dict[str, Any] | None) -> dict[str, str]:
    gaps = (entry or {}).get("gaps")
    return {str(k): str(v) for k, v in gaps.items()} if isinstance(gaps, dict) else {}


# --- measuring the peaks ----------------------------------------------------------------------------------------


@dataclass
class Calibration:
    """What one calibration found: the roofs, why the other dtypes have none, and the size each roof came at."""

    peaks: dict[str, float] = field(default_factory=dict)
    gaps: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)


def peak_dtypes(device: str, native: hardware.NativeTypes | None = None,
                capability: tuple[int, int] | None = None) -> tuple[list[str], dict[str, str]]:
    """The dtypes whose roof the calibration measures on `device`, and those it skips, with why.

    fp32 always; bf16 and fp16 only where the device computes them natively (`native`, by default
    hardware.native_types); tf32 on a CUDA device of compute capability 8.0 or newer (`capability`, by default
    torch's). On the CPU fp16 is not measured at all: no probe runs it there (fp16 autocast is CUDA-only here).
    """
    native = native or hardware.native_types(device)
    if device.startswith("cuda"):
        if capability is None:
            import torch

            capability = torch.cuda.get_device_capability(torch.device(device))
        candidates = ["fp32", "bf16", "fp16"] + (["tf32"] if tuple(capability) >= (8, 0) else [])
    else:
        candidates = ["fp32", "bf16"]
    measured, skipped = [], {}
    for name in candidates:
        verdict = native.get(name) if name in ("bf16", "fp16") else None
        if verdict is None or verdict.native:
            measured.append(name)
        else:
            skipped[name] = f"skipped: {verdict.reason}"
    return measured, skipped


def calibrate(device: str, time_left_s: float | None = None, *, size: int | None = None,
              min_time_s: float = MIN_TIME_S, per_dtype_s: float = PER_DTYPE_S,
              dtypes: tuple[list[str], dict[str, str]] | None = None,
              timer: Callable[[str, str], MatmulTimer] | None = None,
              on_progress: Callable[[Calibration], None] | None = None) -> Calibration:
    """Measure `device`'s roofs in this process: each dtype within `per_dtype_s`, all within `time_left_s` (None:
    no overall bound).

    `size` fixes n instead of growing it; `dtypes` replaces `peak_dtypes(device)`; `timer(device, dtype)` replaces
    the torch matmul (`torch_timer`); `on_progress` gets the calibration after each dtype, so that what is measured
    is kept should the process be stopped.
    """
    started = time.perf_counter()
    planned, skipped = dtypes if dtypes is not None else peak_dtypes(device)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    start, largest = (size, size) if size else (START_SIZE[kind], MAX_SIZE[kind])
    make_timer = timer or torch_timer
    cal = Calibration(gaps=dict(skipped))
    for i, name in enumerate(planned):
        bound = per_dtype_s
        if time_left_s is not None:  # an equal share of what is left for each dtype still to measure
            left = time_left_s - (time.perf_counter() - started) - EXIT_MARGIN_S
            bound = min(bound, left / (len(planned) - i))
        if bound <= 0:
            cal.gaps[name] = f"{OUT_OF_TIME} of the calibration's {time_left_s or 0:.3g} s"
            continue
        try:
            cal.peaks[name], cal.sizes[name] = measure_roof(make_timer(device, name), start, largest, bound,
                                                            min_time_s)
        except Exception as exc:  # noqa: BLE001 — one dtype failing (a kernel missing) leaves the others' roofs
            cal.gaps[name] = f"not measured: {type(exc).__name__}: {exc}"[:300]
        if on_progress:
            on_progress(cal)
    return cal


def measure_peaks(device: str, size: int | None = None, min_time_s: float = MIN_TIME_S,
                  **options: Any) -> dict[str, float]:
    """Best FLOP/s of n×n by n×n matmuls per dtype on `device`, in this process (`calibrate`'s roofs)."""
    return calibrate(device, size=size, min_time_s=min_time_s, **options).peaks


def measure_roof(timer: MatmulTimer, start: int, largest: int, bound_s: float,
                 min_time_s: float = MIN_TIME_S) -> tuple[float, int]:
    """(best FLOP/s, the n it came at) of n×n matmuls, n doubling from `start` up to `largest`, in about
    `bound_s`.

    Larger matmuls climb to the BLAS plateau, but a slow machine or an emulated dtype must not stall the run: the
    next size (8x the work) is tried only while MIN_REPS of its matmuls are predicted to fit in the time left, and
    not once a size gained less than PLATEAU_GAIN. The first matmul of a size (set-up, page faults) is timed with
    the rest; the fastest one counts.
    """
    deadline = time.perf_counter() + bound_s
    best, best_n, n = 0.0, start, start
    while True:
        at_size = time.perf_counter()
        try:
            times = [timer(n)]
        except RuntimeError:  # out of memory past the first size: the smaller sizes' best stands
            if best:
                return best, best_n
            raise
        while (len(times) < MAX_REPS and (len(times) < MIN_REPS or time.perf_counter() - at_size < min_time_s)
               and time.perf_counter() + min(times) < deadline):
            times.append(timer(n))
        fastest = max(min(times), 1e-9)
        rate = 2 * n**3 / fastest
        plateau = rate < PLATEAU_GAIN * best
        if rate > best:
            best, best_n = rate, n
        if plateau or 2 * n > largest or time.perf_counter() + MIN_REPS * 8 * fastest > deadline:
            return best, best_n
        n *= 2


def torch_timer(device: str, dtype: str) -> MatmulTimer:
    """Times one n×n torch.mm of `dtype` ("fp32", "tf32", "bf16", "fp16") on `device`; on CUDA by events, so that
    launch latency does not count. The operands are made once per size."""
    import torch

    cuda = device.startswith("cuda")
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    operands: dict[int, tuple] = {}

    def run(n: int) -> float:
        if n not in operands:
            operands.clear()  # the previous size's memory first
            operands[n] = (torch.randn(n, n, device=device, dtype=torch_dtype),
                           torch.randn(n, n, device=device, dtype=torch_dtype))
        a, b = operands[n]
        if not cuda:
            begin = time.perf_counter()
            torch.mm(a, b)
            return time.perf_counter() - begin
        tf32_before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        try:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            torch.mm(a, b)
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) / 1000
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32_before

    return run


def ensure_peaks(device: str, timeout_s: float = PEAK_TIMEOUT_S,
                 retry: bool = False) -> tuple[dict[str, float] | None, str]:
    """The cached peaks of `device` on this machine, measuring them first (in a child process, within
    `timeout_s`) when there are none.

    A calibration that failed or ran out of time is cached as well, with why, so that each run does not wait for
    it again: it is rerun when `retry`, or, having run out of time, when given RETRY_FACTOR times as long. Returns
    (peaks or None, a status line). Never raises: MFU is an extra, not a reason to stop an analysis.
    """
    try:
        key = peak_key(device)
        entry = cached_entry(device, key)
        if entry is not None and not _rerun(entry, timeout_s, retry):
            return _answer(entry, f"cached in {cache_path()}", cached=True)
        failure, timed_out = _run_calibration(device, key, timeout_s)
        entry = _record_outcome(key, device, timeout_s, failure, timed_out)
        return _answer(entry, f"measured into {cache_path()}", failure=failure)
    except Exception as exc:  # e.g. an unwritable cache folder
        return None, f"error: {type(exc).__name__}: {exc}"


def _rerun(entry: dict[str, Any], timeout_s: float, retry: bool) -> bool:
    if not entry.get("incomplete"):
        return False  # complete, or dtypes skipped as not native: the hardware will not change
    if retry:
        return True
    return bool(entry.get("timed_out")) and timeout_s >= RETRY_FACTOR * float(entry.get("time_limit_s") or 0)


def _run_calibration(device: str, key: str, timeout_s: float) -> tuple[str | None, bool]:
    """Run the calibration child; (why it failed or None, whether it ran out of time)."""
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    deadline = time.time() + timeout_s  # wall-clock: the child's own clock starts after Python and torch load
    try:
        done = subprocess.run([sys.executable, "-m", "tune_advisor.collectors.flops", device, "--key", key,
                               "--deadline", f"{deadline:.3f}"],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return f"measuring the peak took over {timeout_s:g} s", True
    if done.returncode == 0:
        return None, False
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return f"measuring the peak failed ({tail[0][:200]})", False


def _record_outcome(key: str, device: str, timeout_s: float, failure: str | None,
                    timed_out: bool) -> dict[str, Any]:
    """Complete the entry the child left (or make one) with why each dtype it did not reach has no roof."""
    entry = cached_entry(device, key) or {}
    peaks = _peaks_of(entry) or {}
    gaps = _gaps_of(entry)
    planned, skipped = peak_dtypes(device)
    gaps.update({name: why for name, why in skipped.items() if name not in gaps})
    for name in planned:
        if name not in peaks and name not in gaps:
            gaps[name] = f"not measured: {failure or 'the calibration ended before it'}"
    timed_out = timed_out or any(why.startswith(OUT_OF_TIME) for why in gaps.values())
    facts = {"time_limit_s": timeout_s, "timed_out": timed_out, "error": failure}
    store_peaks(key, device, peaks, entry.get("method") or "nothing measured", gaps,
                sizes=entry.get("sizes") or {}, **facts)
    return cached_entry(device, key) or {}


def _answer(entry: dict[str, Any], where: str, failure: str | None = None,
            cached: bool = False) -> tuple[dict[str, float] | None, str]:
    """(peaks or None, status line) of a cache entry: "ok: ..." with the missing roofs named, or "error: ..."."""
    peaks = _peaks_of(entry)
    missing = "; ".join(f"{name} {why}" for name, why in _gaps_of(entry).items() if name not in (peaks or {}))
    if peaks:
        return peaks, f"ok: {where}" + (f" ({missing})" if missing else "")
    why = failure or entry.get("error") or missing or "no roof measured"
    if cached:
        why += f" (recorded in {cache_path()}; `tune-advisor env --measure-peaks` tries again)"
    return None, f"error: {why}"


def main(argv: list[str]) -> int:
    """`python -m tune_advisor.collectors.flops DEVICE [--key KEY] [--deadline UNIX_TIME]`: measure, cache and print
    the peaks (by the deadline, when one is given)."""
    device = argv[0] if argv and not argv[0].startswith("--") else "cpu"
    key = argv[argv.index("--key") + 1] if "--key" in argv else peak_key(device)
    time_left = float(argv[argv.index("--deadline") + 1]) - time.time() if "--deadline" in argv else None
    kind = "cuda" if device.startswith("cuda") else "cpu"
    method = f"best of torch.mm n x n per dtype, n doubling from {START_SIZE[kind]} within {PER_DTYPE_S:g} s"

    def save(cal: Calibration) -> None:
        store_peaks(key, device, cal.peaks, method, cal.gaps, sizes=cal.sizes)

    cal = calibrate(device, time_left, on_progress=save)
    save(cal)
    print(json.dumps({"key": key, "flops_per_s": cal.peaks, "gaps": cal.gaps, "sizes": cal.sizes}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
