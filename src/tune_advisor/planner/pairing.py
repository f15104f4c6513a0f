"""Whether two settings can be measured side by side in a lockstep pair: the backend must pair at all, the two must
share a loader (`keep.together`), and both must fit in memory at once, which for settings not yet run is estimated
from the probes measured so far."""

from __future__ import annotations

from typing import Any

from ..collectors import cuda_memory
from ..probe.backend import ProbeBackend
from ..probe.result import ProbeResult
from .keep import together, without


def can_pair(backend: ProbeBackend, reference: ProbeResult, settings: dict[str, Any], peak: float | None) -> bool:
    """Whether `backend` can measure `reference` beside `settings` (whose probe peaks at `peak` bytes) in a
    lockstep pair: not where it cannot pair at all (DDP, --executor ray), with different loaders (see
    `together`), or where both would not fit in memory at once (`backend.pair_memory_bytes`)."""
    if not (backend.can_pair and together(reference.settings, settings)):
        return False
    room = backend.pair_memory_bytes
    # On a GPU a process holds its allocator's reserved blocks, not only what is allocated (cuda_memory)
    held = cuda_memory.footprint(reference.peak_memory_bytes, reference.memory)
    return not (room and held + (peak or 0) > room)


def pairs(backend: ProbeBackend, reference: ProbeResult, candidate: ProbeResult) -> bool:
    """Whether a duel of these two probes' settings would run in lockstep (`can_pair`)."""
    return can_pair(backend, reference, candidate.settings, candidate.peak_memory_bytes)


def extrapolated_peak(probes: list[ProbeResult], settings: dict[str, Any]) -> float | None:
    """The peak memory of `settings` on the straight line through the two largest batches measured (`probes`) with
    the same other settings; None with fewer than two."""
    same = without(settings, "batch_size")
    points = sorted({p.settings["batch_size"]: p.peak_memory_bytes for p in probes
                     if p.ok and p.peak_memory_bytes and without(p.settings, "batch_size") == same}.items())
    if len(points) < 2:
        return None
    (b0, m0), (b1, m1) = points[-2], points[-1]
    return m1 + (m1 - m0) / (b1 - b0) * (settings["batch_size"] - b1)


def estimated_peak(seen: ProbeResult | None, probes: list[ProbeResult], settings: dict[str, Any],
                   reference: ProbeResult) -> float | None:
    """The peak memory of `settings` before it ran: measured (`seen`, their earlier probe), or on the line through
    measured batches (`extrapolated_peak`), or else `reference`'s scaled in proportion to the batch, which
    over-estimates (the weights do not grow with it; on a CPU, neither do the loader workers' processes)."""
    if seen is not None and seen.ok and seen.peak_memory_bytes:
        return seen.peak_memory_bytes
    line = extrapolated_peak(probes, settings)
    if line is not None:
        return max(line, 0.0)
    if not reference.peak_memory_bytes:
        return None
    return reference.peak_memory_bytes * max(1.0, settings["batch_size"] / reference.settings["batch_size"])
