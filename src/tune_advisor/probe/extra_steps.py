"""Collectors that run steps of their own in the probe child, after the timed steps: FLOPs of one step, and the
profiler over a few. Each returns a status note for `extra.collectors`; a failure is that note, never the probe's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..analysis.stats import median
from ..collectors import flops, profiler
from .spec import ProbeSpec


def count_flops(spec: ProbeSpec, out: dict[str, Any], forward_backward: Callable[[], float]) -> str:
    """`extra.flops`: FLOPs of one step scaled to the typical measured batch, and MFU against the cached peak.

    `forward_backward` runs one step's forward and backward and returns its items."""
    try:
        raw = out["raw"]
        items: list[float] = []
        by_op = flops.count_flops_by_op(lambda: items.append(forward_backward()))
        counted = sum(by_op.values())
        per_step = counted * median(raw["items"]) / items[0] if items and items[0] else counted
        key = flops.peak_key(spec.device)
        peaks = flops.cached_peaks(spec.device, key)
        dtype = flops.compute_dtype(spec.settings["amp"], spec.device, flops.conv_share(by_op))
        summary = flops.summarise(per_step, median(raw["step_s"]), peaks, dtype, flops.peak_gaps(spec.device, key))
        out["extra"]["flops"] = summary
    except Exception as exc:  # noqa: BLE001 — a collector's failure is a note, not a probe failure
        return f"error: {type(exc).__name__}: {exc}"
    if summary["mfu"] is None:
        return f"partial: {summary['mfu_unavailable']} (cache: {flops.cache_path()})"
    return "ok"


def profile(spec: ProbeSpec, out: dict[str, Any], workdir: Path | None, run_step: Callable[[int], float]) -> str:
    """`extra.profile`: torch.profiler over a few extra steps (`run_step(i)`, i from 0); the gzipped trace goes next
    to the result."""
    losses, loss_steps = out["raw"]["loss"], out["raw"]["loss_step"]
    kept = len(losses)
    try:
        trace_path = workdir / f"{spec.id}.trace.json.gz" if workdir is not None else None
        steps = out["raw"].get("step_s") or []
        schedule = profiler.schedule_within(median(steps) if steps else 0.0, spec.budget_left_s)
        summary = profiler.profile_steps(run_step, spec.device.split(":")[0], trace_path, **schedule)
    except Exception as exc:  # noqa: BLE001 — including a loss turning non-finite in a profiled step
        del losses[kept:], loss_steps[kept:]  # the profiled steps are not measured steps
        return f"error: {type(exc).__name__}: {exc}"
    out["extra"]["profile"] = summary
    note = summary["trace"].get("note")
    return f"ok ({note})" if note else "ok"
