"""Whether two settings can be measured side by side in a lockstep pair: the backend must pair at all, the two must
share a loader (`keep.together`; pin_memory too where the steps are timed on the host clock: `host_paced`), and
both must fit in memory at once, which for settings not yet run is estimated from the probes measured so far."""

from __future__ import annotations

from typing import Any

from ..collectors import cuda_memory
from ..probe import device_clock
from ..probe.backend import ProbeBackend
from ..probe.result import ProbeResult
from .keep import LOADER_BOUND, together, without


# A baseline whose loading thread (no workers) was on a CPU this share of its fetches' wall time or more loads by
# computing (decoding, augmenting): augment_cpu's read 0.57-0.99, io_bound's (storage latency) 0.05-0.1.
LOADING_COMPUTES = 0.5


def can_pair(backend: ProbeBackend, reference: ProbeResult, settings: dict[str, Any], peak: float | None,
             loading_computes: bool = False) -> bool:
    """Whether `backend` can measure `reference` beside `settings` (whose probe peaks at `peak` bytes) in a
    lockstep pair: not where it cannot pair at all (DDP, --executor ray), with different loaders (see
    `together`), where `reference`'s loader workers pace its step (`loader_paced`; `loading_computes`: see
    `computes_loading`), or where both would not fit in memory at once (`backend.pair_memory_bytes`). Both sides
    count what their process holds (`held`): on a GPU a caching allocator keeps freed blocks reserved."""
    if not (backend.can_pair and together(reference.settings, settings, host_paced(reference))):
        return False
    if loader_paced(reference, loading_computes):
        return False
    room = backend.pair_memory_bytes
    return not (room and held(reference) + (peak or 0) > room)


def computes_loading(baseline: ProbeResult | None) -> bool:
    """Whether the workload's loading is CPU work: its baseline, loading without workers, kept its loading thread
    on a CPU LOADING_COMPUTES of its fetches' time or more (`extra.fetch_cpu_frac`); False where unknown."""
    share = baseline.extra.get("fetch_cpu_frac") if baseline is not None else None
    return share is not None and share >= LOADING_COMPUTES


def loader_paced(probe: ProbeResult, loading_computes: bool = False) -> bool:
    """Whether `probe`'s step waits for its loader workers LOADER_BOUND of its time or more, loading that waits
    for storage rather than computes (`loading_computes`: `computes_loading`). A lockstep pair then measures the
    loaders' pace under turns, not the settings': the paused side's workers are paused too, but the I/O they
    wait on goes on. On io_bound (32 loader workers, the steps waiting 80-90% alone) batch 32 read 1,516
    samples/s in a pair beside batch 128, where it read 5,850-6,050 alone; a pair beside batch 16 had read 16 at
    1.09-1.20x of 32, where alone it read about 0.7x. Loading that computes stops with its paused process
    group, and pairs compare fairly: augment_cpu's ladder read batch 128 beside 2 workers at 1.43x in lockstep,
    and its confirmations in turn agreed."""
    return ((probe.settings.get("num_workers") or 0) > 0 and (probe.data_wait_frac() or 0.0) >= LOADER_BOUND
            and not loading_computes)


def host_paced(probe: ProbeResult) -> bool:
    """Whether `probe`'s steps were timed on the host clock (`extra.step_clock`), not by CUDA events with a step in
    flight (probe/device_clock.py): a framework's own loop and DDP ranks synchronise the GPU every step; on a CPU
    the host's is the only clock, and pin_memory does not apply there."""
    return probe.extra.get("step_clock") != device_clock.DEVICE


def in_turn_why(backend: ProbeBackend, reference: ProbeResult, settings: dict[str, Any],
                loading_computes: bool = False) -> str | None:
    """Why `settings` is compared with `reference` one after the other although the two could share a lockstep
    pair otherwise (results.json `extra.in_turn`): a step its loader workers pace (`loader_paced`), or its
    pin_memory on steps timed by the host clock; None else."""
    if not (backend.can_pair and together(reference.settings, settings)):
        return None
    if loader_paced(reference, loading_computes):
        return (f"compared one after the other: the step waits for its loader workers "
                f"{reference.data_wait_frac():.0%} of its time, loading that waits for storage, and side by side "
                f"the loaders' pace under turns would be measured, not the settings'")
    if together(reference.settings, settings, host_paced(reference)):
        return None
    return ("pin_memory is compared one after the other: these steps are timed on the host clock, which waits for "
            "the GPU every step and so measures away the overlap pinned memory buys")


def pairs(backend: ProbeBackend, reference: ProbeResult, candidate: ProbeResult,
          loading_computes: bool = False) -> bool:
    """Whether a duel of these two probes' settings would run in lockstep (`can_pair`, neither loader-paced)."""
    return (can_pair(backend, reference, candidate.settings, held(candidate), loading_computes)
            and not loader_paced(candidate, loading_computes))


def held(probe: ProbeResult) -> int:
    """What `probe`'s process held: on a GPU the allocator's reserved peak, at least the allocated one
    (`cuda_memory.footprint`); on a CPU the process's peak."""
    return cuda_memory.footprint(probe.peak_memory_bytes, probe.memory)


def extrapolated_peak(probes: list[ProbeResult], settings: dict[str, Any]) -> float | None:
    """The peak memory (`held`) of `settings` on the straight line through the two largest batches measured
    (`probes`) with the same other settings; None with fewer than two."""
    same = without(settings, "batch_size")
    points = sorted({p.settings["batch_size"]: held(p) for p in probes
                     if p.ok and held(p) and without(p.settings, "batch_size") == same}.items())
    if len(points) < 2:
        return None
    (b0, m0), (b1, m1) = points[-2], points[-1]
    return m1 + (m1 - m0) / (b1 - b0) * (settings["batch_size"] - b1)


def estimated_peak(seen: ProbeResult | None, probes: list[ProbeResult], settings: dict[str, Any],
                   reference: ProbeResult) -> float | None:
    """The peak memory (`held`: on a GPU the allocator's reserved peak) of `settings` before it ran: measured
    (`seen`, their earlier probe), or on the line through measured batches (`extrapolated_peak`), or else
    `reference`'s scaled in proportion to the batch, which over-estimates (the weights do not grow with it; on a
    CPU, neither do the loader workers' processes)."""
    if seen is not None and seen.ok and held(seen):
        return held(seen)
    line = extrapolated_peak(probes, settings)
    if line is not None:
        return max(line, 0.0)
    if not held(reference):
        return None
    return held(reference) * max(1.0, settings["batch_size"] / reference.settings["batch_size"])
