"""Statistics over probes: a throughput ratio from probe pairs (in lockstep turn by turn, or apart), independent
measures of one ratio pooled or checked for agreement, a probe's rate over its window and its plain wall time.
Pure functions of probes and numbers; planner/compare.py applies them to a plan's ledger."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..analysis import stats
from ..probe.lockstep import turn_sums, turns_of
from ..probe.result import ProbeResult


def _log_se(gains) -> tuple[np.ndarray, np.ndarray]:
    """Each measure's (median, ci_low, ci_high) as log centre and standard error (its 95% CI's half-width over
    1.96, on the log scale)."""
    logs = np.log(np.array(gains, dtype=float))
    return logs[:, 0], np.maximum((logs[:, 2] - logs[:, 1]) / (2 * 1.96), 1e-9)


def pooled(*gains: tuple[float, float, float]) -> tuple[float, float, float]:
    """Independent measures of one ratio, each (median, ci_low, ci_high), as one: their logs weighted by the inverse
    of their variance."""
    centres, se = _log_se(gains)
    weights = 1 / se ** 2
    centre = float(np.sum(weights * centres) / np.sum(weights))
    half = 1.96 / float(np.sqrt(np.sum(weights)))
    return float(np.exp(centre)), float(np.exp(centre - half)), float(np.exp(centre + half))


def agree(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    """Whether two independent measures of a ratio, each (median, ci_low, ci_high), differ by no more than their
    noise: the difference of their logs within 1.96 of its standard errors."""
    centres, se = _log_se([a, b])
    return bool(abs(centres[0] - centres[1]) <= 1.96 * float(np.hypot(*se)))


def window_rate(probe: ProbeResult) -> float:
    """Items per second over the probe's measured window (NaN without one)."""
    return sum(probe.items) / sum(probe.step_s) if probe.measured else float("nan")


def pair_ratio(pairs: list[tuple[ProbeResult, ProbeResult]],
               waves: tuple[int, int] = (1, 1)) -> tuple[float, float, float]:
    """candidate/reference throughput over (reference, candidate) probe pairs: (median, ci_low, ci_high).

    Pairs measured in lockstep have turn k of one side next to turn k of the other (a step each, or several of
    the side with much shorter steps: probe/lockstep.py), so the bootstrap resamples the same blocks of turns on
    both sides and the moments they shared cancel; `waves` (each side's loader wave, in steps) become turns. Pairs
    run one after the other (no `lockstep` in extra, or unequal turn counts) are resampled independently."""
    ok = [(a, b) for a, b in pairs if a.ok and b.ok and a.measured and b.measured]
    if not ok:
        return float("nan"), float("nan"), float("nan")
    turns = [(turns_of(a), turns_of(b)) for a, b in ok if "lockstep" in a.extra and "lockstep" in b.extra]
    paired = len(turns) == len(ok) and all(ta is not None and tb is not None and len(ta) == len(tb)
                                           for ta, tb in turns)
    if not paired:
        pooled = [[x for pair in ok for x in getattr(pair[side], attr)] for side in (0, 1)
                  for attr in ("items", "step_s")]
        return stats.ratio_ci(*pooled, seed=0, waves=waves, paired=False)
    pooled = [[x for pair, sides in zip(ok, turns) for x in turn_sums(getattr(pair[side], attr), sides[side])]
              for side in (0, 1) for attr in ("items", "step_s")]
    per_turn = [min(max(sides[side]) for sides in turns) for side in (0, 1)]
    waves = (-(-waves[0] // per_turn[0]), -(-waves[1] // per_turn[1]))
    return stats.ratio_ci(*pooled, seed=0, waves=waves, paired=True)


def plain_wall(probe: ProbeResult) -> float:
    """What a probe of these settings takes alone: its wall time without the profiler's extra steps (only
    designated probes are profiled) and, for a lockstep side, without its waits for its partner. A lockstep side's
    wall is the pair's: counted whole, one 1-minute lightning_module run reserved 29 s for a confirmation in turn that
    took 14 s, and ended its exploring at 24 s with five knobs "over budget"."""
    lockstep = probe.extra.get("lockstep") or {}
    waited = (lockstep.get("waited_s") or 0.0) + (lockstep.get("ready_wait_s") or 0.0)
    return max(0.0, probe.wall_s - (probe.extra.get("profile_wall_s") or 0.0) - waited)


def settings_key(settings: dict[str, Any]) -> tuple:
    return tuple(sorted(settings.items()))
