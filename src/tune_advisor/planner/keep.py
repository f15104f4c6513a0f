"""The keep rule and what it compares: shared by the session, its planners and the ablation (a leaf module)."""

from __future__ import annotations

from typing import Any

from .. import knobs

MIN_GAIN = 0.03  # a change must beat its reference by 3% (and its ratio CI must exclude 1) to be kept
DUEL_ROLE = "recheck"  # a setting measured again beside another


def together(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether a lockstep pair compares these two settings fairly: only with the same loader. The side waiting for
    its turn is paused (SIGSTOP) with its loader workers, but the I/O they wait on goes on, so batches come ready during
    the other side's turn: that favours the side with more workers, and lockstep measures the step, not the
    loader. Loader changes are large or nothing, and are measured one after the other."""
    return all(a.get(k) == b.get(k) for k in ("num_workers", *knobs.LOADER_KNOBS))


def without(settings: dict[str, Any], name: str) -> dict[str, Any]:
    """`settings` but for knob `name`."""
    return {k: v for k, v in settings.items() if k != name}
