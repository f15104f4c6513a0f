"""The statistics behind a gate verdict: rounds of raw step samples in, a ratio with a confidence interval out.

A *round* is one probe (one child process). A side (the stored baseline, or the code at a git ref, or the code
under test) is measured in several rounds, so its record carries run-to-run spread as well as step-to-step noise.
Everything here is plain numpy over lists of floats, so it is tested in milliseconds with synthetic samples.
docs/ci-gating.md explains the reasoning.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..analysis import stats

BOOTSTRAP_RESAMPLES = 4000
LEVEL = 0.95

# How a side was measured relative to the other: in the same job, alternating (drift hits both alike), or in
# another job whose conditions we only know through its recorded round-to-round spread.
INTERLEAVED = "interleaved"
STORED = "stored"

# metric -> whether a larger value is better
HIGHER_IS_BETTER = {"throughput": True, "step_time": False, "peak_memory": False}


@dataclass(frozen=True)
class Round:
    """One probe's raw samples: per-step wall times, items per step, and the probe's peak memory."""

    step_s: Sequence[float]
    items: Sequence[float]
    peak_memory_bytes: int | None = None

    @property
    def throughput(self) -> float:
        total = float(np.sum(self.step_s))
        return float(np.sum(self.items)) / total if total > 0 else float("nan")

    @property
    def step_time(self) -> float:
        """Mean step time: total time over steps, the inverse of the step rate the bootstrap resamples."""
        return float(np.sum(self.step_s)) / len(self.step_s) if len(self.step_s) else float("nan")

    def value(self, metric: str) -> float:
        if metric == "throughput":
            return self.throughput
        if metric == "step_time":
            return self.step_time
        return float(self.peak_memory_bytes) if self.peak_memory_bytes else float("nan")


@dataclass
class Sample:
    """All rounds of one side."""

    rounds: list[Round]
    unit: str = "samples/s"

    def values(self, metric: str) -> np.ndarray:
        return np.array([r.value(metric) for r in self.rounds], dtype=float)

    def level(self, metric: str) -> float:
        """The median over rounds of the metric."""
        values = self.values(metric)
        values = values[np.isfinite(values)]
        return float(np.median(values)) if values.size else float("nan")

    def spread(self, metric: str) -> float:
        """Round-to-round spread: (max - min) / median of the per-round values; 0 with a single round."""
        values = self.values(metric)
        values = values[np.isfinite(values)]
        if values.size < 2 or np.median(values) <= 0:
            return 0.0
        return float((values.max() - values.min()) / np.median(values))


@dataclass
class Interval:
    """A point estimate with its 95% CI, and the CI widened by the allowance for drift between jobs (a fraction
    of the median)."""

    median: float
    low: float
    high: float
    allowance: float = 0.0  # relative widening applied to [low, high]

    # The CI's half-widths and the allowance are independent errors, so they add in quadrature (root sum of
    # squares) rather than end to end, which would count the rounds' scatter twice: the bootstrap resamples rounds.
    @property
    def wide_low(self) -> float:
        return max(0.0, self.median * (1 - math.hypot(1 - self.low / self.median, self.allowance)))

    @property
    def wide_high(self) -> float:
        return self.median * (1 + math.hypot(self.high / self.median - 1, self.allowance))

    def to_dict(self) -> dict[str, Any]:
        d = {"median": _num(self.median), "ci_low": _num(self.low), "ci_high": _num(self.high)}
        if self.allowance:
            d.update(allowance=_num(self.allowance), ci_low_widened=_num(self.wide_low),
                     ci_high_widened=_num(self.wide_high))
        return d


@dataclass
class Evidence:
    """What the checks judge: the side under test, the reference side (or None), and how they were measured."""

    candidate: Sample
    reference: Sample | None = None
    mode: str | None = None  # INTERLEAVED or STORED when there is a reference
    seed: int = 0
    _cache: dict = field(default_factory=dict, repr=False)

    def ratio(self, metric: str) -> Interval:
        """candidate / reference for a time metric (throughput, step_time), bootstrapped; cached per metric."""
        if metric not in self._cache:
            self._cache[metric] = ratio_interval(self.candidate, self.reference, metric, self.mode, self.seed)
        return self._cache[metric]

    def level(self, metric: str, side: str = "candidate") -> Interval:
        """A side's own level (`level_interval`): the one figure every check prints for that side."""
        key = ("level", metric, side)
        if key not in self._cache:
            sample = self.candidate if side == "candidate" else self.reference
            self._cache[key] = level_interval(sample, metric, self.seed)
        return self._cache[key]


def round_distributions(sample: Sample, steps_only: bool, seed: int, n_boot: int) -> np.ndarray:
    """(rounds, n_boot) moving-block bootstrap distributions of each round's rate.

    The rate is items/s, or steps/s when `steps_only` (its inverse is the mean step time).
    """
    rows = []
    for i, r in enumerate(sample.rounds):
        items = np.ones(len(r.step_s)) if steps_only else r.items
        dist = stats.throughput_distribution(items, r.step_s, seed=seed + 7919 * i, n_boot=n_boot)
        rows.append(dist if dist.size else np.full(n_boot, np.nan))
    # No usable round: one all-NaN row, so every statistic comes out NaN and the check reports an error.
    return np.vstack(rows) if rows else np.full((1, n_boot), np.nan)


def _pick_rounds(n_rounds: int, rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """Rounds drawn with replacement for each bootstrap replicate: the outer level of a two-level bootstrap."""
    return rng.integers(0, n_rounds, size=(n_boot, n_rounds))


def _side(sample: Sample, steps_only: bool, seed: int, n_boot: int) -> np.ndarray:
    """Bootstrap distribution of a side's rate: rounds resampled, then steps within each round (mean over rounds)."""
    dists = round_distributions(sample, steps_only, seed, n_boot)
    pick = _pick_rounds(len(dists), np.random.default_rng(seed), n_boot)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: reported as an error by the check
        return np.nanmean(dists[pick, np.arange(n_boot)[:, None]], axis=1)


def _interval(dist: np.ndarray, level: float = LEVEL) -> tuple[float, float, float]:
    dist = dist[np.isfinite(dist)]
    if dist.size == 0:
        return float("nan"), float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    low, mid, high = np.percentile(dist, [tail, 50, 100 - tail])
    return float(mid), float(low), float(high)


def ratio_interval(candidate: Sample, reference: Sample, metric: str, mode: str | None, seed: int = 0,
                   n_boot: int | None = None) -> Interval:
    """candidate/reference of `throughput` or `step_time` with a 95% CI.

    Interleaved: rounds are pairs measured together in lockstep (drift within a round hits both sides alike); the
    ratio is the Hodges-Lehmann centre of the rounds' ratios with its CI over the rounds (`stats.rounds_ratio_interval`:
    Student's t over their geometric mean below seven rounds, from seven the centre's own interval from their
    pairwise means with stray rounds clipped), never narrower than the CI from the rounds' steps (resampled in the
    same blocks on both sides). Stored: the sides are resampled independently and the CI is then widened by the
    larger round-to-round spread of the two sides (the allowance), because the reference ran in another job under
    conditions this job cannot see.
    """
    steps_only = metric == "step_time"
    n_boot = n_boot or BOOTSTRAP_RESAMPLES
    # Lockstep pairs (probe/lockstep.py) have as many steps on each side, step k of one run right next to step k
    # of the other: the same seed resamples the same blocks of steps on both sides, so the machine state they
    # shared cancels within each pair, as it did when they ran.
    lockstep = mode == INTERLEAVED and len(candidate.rounds) == len(reference.rounds) and all(
        len(c.step_s) == len(r.step_s) for c, r in zip(candidate.rounds, reference.rounds))
    cand = round_distributions(candidate, steps_only, seed, n_boot)
    ref = round_distributions(reference, steps_only, seed if lockstep else seed + 1, n_boot)
    n_cand, n_ref = len(cand), len(ref)
    rng = np.random.default_rng(seed)
    col = np.arange(n_boot)[:, None]
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows: reported as an error by the check
        if mode == INTERLEAVED and n_cand == n_ref:
            # Steps of one round are not independent draws (the machine's state carries from step to step and
            # from one side's step to the other's), so resampling them makes the CI too narrow: A/A runs of
            # unchanged code read 0.90x [0.85, 0.98] and 1.09x [1.06, 1.20]. The rounds are the independent
            # measurements: the interval over their ratios, the steps' bootstrap as a floor.
            pick = _pick_rounds(n_cand, rng, n_boot)
            within = _interval(np.exp(np.nanmean(np.log(cand[pick, col] / ref[pick, col]), axis=1)))
            rates = [(c.value("throughput") if not steps_only else 1 / c.step_time,
                      r.value("throughput") if not steps_only else 1 / r.step_time)
                     for c, r in zip(candidate.rounds, reference.rounds)]
            centre, low, high = stats.rounds_ratio_interval([c / r for c, r in rates], within=within[1:])
            if steps_only:  # a step-time ratio is the inverse of the step-rate ratio
                centre, low, high = 1 / centre, 1 / high, 1 / low
            return Interval(centre, low, high)
        else:
            cand_rate = np.nanmean(cand[_pick_rounds(n_cand, rng, n_boot), col], axis=1)
            ref_rate = np.nanmean(ref[_pick_rounds(n_ref, rng, n_boot), col], axis=1)
            rate_ratio = cand_rate / ref_rate
            allowance = max(candidate.spread(metric), reference.spread(metric))
    # A step-time ratio is the inverse of the step-rate ratio: slower code has a ratio above 1.
    ratio = 1 / rate_ratio if steps_only else rate_ratio
    return Interval(*_interval(ratio), allowance=allowance)


def level_interval(sample: Sample, metric: str, seed: int = 0, n_boot: int | None = None) -> Interval:
    """The side's own throughput (items/s) or mean step time (s) with a 95% CI over rounds and steps."""
    steps_only = metric == "step_time"
    rate = _side(sample, steps_only, seed, n_boot or BOOTSTRAP_RESAMPLES)
    return Interval(*_interval(1 / rate if steps_only else rate))


def memory_ratio(candidate: Sample, reference: Sample) -> dict[str, float] | None:
    """Peak memory: the median ratio, and the ratio of the smallest candidate round to the largest reference round.

    Peak memory barely varies within a run, so there is no step-level noise to bootstrap; the honest test is
    whether *every* candidate round exceeds *every* reference round by the threshold (`worst_case` > 1 + t).
    """
    cand, ref = candidate.values("peak_memory"), reference.values("peak_memory")
    cand, ref = cand[np.isfinite(cand)], ref[np.isfinite(ref)]
    if not cand.size or not ref.size:
        return None
    return {"median": float(np.median(cand) / np.median(ref)), "worst_case": float(cand.min() / ref.max()),
            "candidate_min": float(cand.min()), "reference_max": float(ref.max())}


def _num(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), 6)
