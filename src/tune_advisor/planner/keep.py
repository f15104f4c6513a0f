"""The keep rule and what it compares: shared by the session, its planners and the ablation (a leaf module)."""

from __future__ import annotations

from typing import Any

from .. import knobs

MIN_GAIN = 0.03  # a change must beat its reference by 3% (and its ratio CI must exclude 1) to be kept
DUEL_ROLE = "recheck"  # a setting measured again beside another
LOADER_BOUND = 0.3  # a step that waits for data this share of its time or more is paced by its loader


def together(a: dict[str, Any], b: dict[str, Any], host_paced: bool = False) -> bool:
    """Whether a lockstep pair compares these two settings fairly: only with the same loader. The side waiting for
    its turn is paused (SIGSTOP) with its loader workers, but the I/O they wait on goes on, so batches come ready during
    the other side's turn: that favours the side with more workers, and lockstep measures the step, not the
    loader. Loader changes are large or nothing, and are measured one after the other.

    `host_paced`: the steps are timed on the host clock, the GPU synchronised after each (a framework's own loop, a
    DDP rank), not by CUDA events with a step in flight (probe/device_clock.py). Such steps measure away what
    pinned memory buys, the host fetching and queueing the next batch while the GPU computes, so pin_memory must
    then match too, and a change of it is measured one after the other, where each side runs free."""
    paced = ("pin_memory",) if host_paced else ()
    return all(a.get(k) == b.get(k) for k in ("num_workers", *knobs.LOADER_KNOBS, *paced))


def without(settings: dict[str, Any], name: str) -> dict[str, Any]:
    """`settings` but for knob `name`."""
    return {k: v for k, v in settings.items() if k != name}
