"""Statistics over raw step samples: noise, throughput with a bootstrap CI, and the CI of a ratio of two runs."""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

# torch.utils.benchmark calls a measurement noisy when IQR/median exceeds 0.1; probes keep measuring past it.
NOISE_BAR = 0.1
BOOTSTRAP_RESAMPLES = 2000

# How far rounds of fresh processes spread, one round from the next, where they share no moments (in turn) or only
# half-second turns (timed turns): what separates them is each process's level, a property of the machine more than of
# the settings. A few rounds cannot estimate it: two rounds leave one degree of freedom (t = 12.7), and a 1-minute cnn
# run confirmed bf16 + channels_last at 1.96x and 1.77x in two rounds in timed turns, 1.87x [0.97, 3.59], and kept the
# baseline. So their own spread is pooled with this one (`pooled_log_sd`'s prior), in a confirmation
# (planner/confirm.py), in duels in turn (planner/compare.gain) and wherever one measurement's steps are too few to
# resample (`rounds_with_prior`), counted as ROUND_SPREAD_DF degrees of freedom (benchmarks/round_spread.py;
# benchmarks/results/round_spread.md). It is the prior that predicts each round of a confirmation from its others:
# over 108 confirmations of the shipped fixtures (292 degrees of freedom, pooled 0.070, heavy-tailed: largest 0.22),
# at 0.08 the 95% prediction interval from the other rounds held 393 of 400 rounds (98.2%), at 0.06 96.8%; from two
# rounds the interval held the mean of the later rounds in 41 of 43 confirmations, as at 0.11 (a calibrated 95% CI
# holds a later mean 83-89% of the time). It was 0.15, then 0.11 (133 confirmations pooled 0.098, AMD EPYC 0.104),
# where a 1-minute lstm_collate confirmation read the fused optimizer 1.05-1.12x in five rounds, [0.99, 1.16], and
# kept the baseline. A confirmation whose own rounds spread further widens its interval by their own degrees of
# freedom. Two rounds then confirm a gain of 1.14x or more (the CI's low end above 1), three 1.10x, so a
# confirmation keeps back CONFIRM_MIN_ROUNDS of any kind and runs more while its CI is
# wide and the budget allows; from WALSH_MIN_ROUNDS rounds their own interval decides alone. Step-by-step
# lockstep rounds pool it too, with the run's other repeated lockstep comparisons (planner/confirm.py's `_pooled_spread`): each round is
# still a pair of fresh processes, and their few rounds can agree by chance or part widely (a lstm_collate
# confirmation's 8 such rounds read 1.27x [1.26, 1.29] and its re-measure 1.43x; on a machine loaded by a test suite,
# one tiny_batch_mlp confirmation's two rounds read 7.6x and 18.6x, and Student's t with one degree of freedom stated
# [0.04, 3554.61]).
ROUND_SPREAD = 0.08
ROUND_SPREAD_DF = 4
# The same for the search's duels in turn (planner/compare.in_turn_drift), whose runs fork from the search's
# long-lived zygotes where a confirmation's start new ones: 84 comparisons of the shipped fixtures on a 2-core Intel
# Xeon spread 0.026 at the median, pooled 0.090 (148 degrees of freedom: heavy tails, augment_cpu 0.114 and one
# disturbed lightning_module comparison 0.63). At 0.08 pooled with each comparison's own (4 degrees of freedom, as
# ROUND_SPREAD) the 95% prediction interval from the other rounds held 229 of 232 rounds (98.7%), as at 0.11; at
# 0.06 95.3% (benchmarks/round_spread.py --exploration). At 0.11 a 1-minute hf_trainer run read persistent workers
# 1.07x, 1.05x, 1.10x and 1.16x faster in four rounds and kept neither them nor what they made pay (batch 32, fused,
# compile: 2.90x in 2 minutes).
EXPLORATION_SPREAD = 0.08
EXPLORATION_SPREAD_DF = ROUND_SPREAD_DF


def median(values: Sequence[float]) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def iqr(values: Sequence[float]) -> float:
    if not len(values):
        return float("nan")
    q1, q3 = np.percentile(values, [25, 75])
    return float(q3 - q1)


def relative_iqr(values: Sequence[float]) -> float:
    m = median(values)
    return iqr(values) / m if m > 0 else float("inf")


def period(workers: int, cycle: int = 1) -> int:
    """Steps after which a step series repeats: a loader wave of `workers` steps (analysis.stats.wave_noise) and
    an accumulation `cycle` (one step in `cycle` also steps the optimizer), both whole."""
    return math.lcm(max(1, workers), max(1, cycle))


def wave_sums(values: Sequence[float], wave: int, n_waves: int | None = None) -> np.ndarray:
    """`values` summed over consecutive loader waves of `wave` steps: the first `n_waves` whole waves (default:
    all of them)."""
    wave = max(1, wave)
    n_waves = len(values) // wave if n_waves is None else n_waves
    return np.asarray(values[: n_waves * wave], dtype=float).reshape(n_waves, wave).sum(axis=1)


def wave_noise(step_times: Sequence[float], wave: int) -> float:
    """IQR/median of step times summed over loader waves of `wave` consecutive steps.

    With k loader workers, batches arrive in waves: one step waits for data, the next k-1 find it ready. Single
    step times are then bimodal by design and their IQR says nothing about how stable the throughput is; the sum
    over a wave is what repeats. Needs at least 4 whole waves, else reports infinite noise.
    """
    if len(step_times) // max(1, wave) < 4:
        return float("inf")
    return relative_iqr(wave_sums(step_times, wave))


def _block_length(n: int, wave: int = 1) -> int:
    """The bootstrap's block of consecutive steps for a series of `n`: ~sqrt(n), and at least two loader waves."""
    return max(1, int(round(np.sqrt(n))), 2 * max(1, wave))


def resamples(n: int, wave: int = 1) -> bool:
    """Whether a series of `n` steps holds two whole bootstrap blocks: fewer, and every resample is the series
    itself (blocks are circular), so its interval would have no width at all. A 2-minute io_bound run kept batch
    128 beside 32 loader workers at 2.47x [2.47, 2.47] from a lockstep pair of 9 turns, its loader's wave 32."""
    return n >= 2 * _block_length(n, wave)


def _block_resample_sums(items: np.ndarray, times: np.ndarray, rng: np.random.Generator, n_boot: int,
                         wave: int = 1):
    """Moving-block bootstrap sums of items and times.

    Steps are not independent: a loader with k workers delivers batches in waves of k, so a slow step is followed
    by fast ones. Resampling blocks of consecutive steps — ~sqrt(n), and at least two waves — keeps that
    structure inside each block; shorter blocks would mix waves and make the interval too wide or too narrow.
    """
    n = len(times)
    block = min(n, _block_length(n, wave))
    n_blocks = -(-n // block)
    starts = rng.integers(0, n, size=(n_boot, n_blocks))
    index = (starts[:, :, None] + np.arange(block)) % n  # circular blocks
    index = index.reshape(n_boot, -1)[:, :n]
    return items[index].sum(axis=1), times[index].sum(axis=1)


def throughput_distribution(items: Sequence[float], times: Sequence[float], seed: int = 0,
                            n_boot: int = BOOTSTRAP_RESAMPLES, wave: int = 1) -> np.ndarray:
    """Bootstrap distribution of items/s over the measured window (total items / total time); `wave` is the
    loader's worker count (steps per wave of batches)."""
    items_a, times_a = np.asarray(items, dtype=float), np.asarray(times, dtype=float)
    if len(times_a) == 0 or times_a.sum() <= 0:
        return np.array([])
    rng = np.random.default_rng(seed)
    item_sums, time_sums = _block_resample_sums(items_a, times_a, rng, n_boot, wave)
    return item_sums / time_sums


def throughput_ci(items: Sequence[float], times: Sequence[float], seed: int = 0, level: float = 0.95,
                  wave: int = 1):
    """(median, ci_low, ci_high) of the window throughput in items/s; NaNs when there are no samples; the window's
    throughput with NaN bounds where its steps are too few to resample (`resamples`)."""
    dist = throughput_distribution(items, times, seed, wave=wave)
    if dist.size == 0:
        return float("nan"), float("nan"), float("nan")
    if not resamples(len(times), wave):
        return float(np.sum(items) / np.sum(times)), float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    low, mid, high = np.percentile(dist, [tail, 50, 100 - tail])
    return float(mid), float(low), float(high)


def ratio_ci(a_items: Sequence[float], a_times: Sequence[float], b_items: Sequence[float],
             b_times: Sequence[float], seed: int = 0, level: float = 0.95, waves: tuple[int, int] = (1, 1),
             paired: bool = False):
    """(median, ci_low, ci_high) of throughput(B) / throughput(A), resampling both runs independently; `paired`
    (runs of as many steps taken side by side, as in lockstep): the same blocks of steps on both sides. The ratio
    of the two windows with NaN bounds where either side's steps are too few to resample (`resamples`): its
    interval must come from elsewhere (`rounds_with_prior`)."""
    if paired:
        wave = max(waves)
        a = throughput_distribution(a_items, a_times, seed, wave=wave)
        b = throughput_distribution(b_items, b_times, seed, wave=wave)
    else:
        a = throughput_distribution(a_items, a_times, seed, wave=waves[0])
        b = throughput_distribution(b_items, b_times, seed + 1, wave=waves[1])
    if a.size == 0 or b.size == 0:
        return float("nan"), float("nan"), float("nan")
    sides = (len(a_times), len(b_times))
    if not all(resamples(n, wave) for n, wave in zip(sides, (max(waves),) * 2 if paired else waves)):
        return float((np.sum(b_items) / np.sum(b_times)) / (np.sum(a_items) / np.sum(a_times))), float("nan"), \
            float("nan")
    ratio = b / a
    tail = (1 - level) / 2 * 100
    low, mid, high = np.percentile(ratio, [tail, 50, 100 - tail])
    return float(mid), float(low), float(high)


def runs_ratio_ci(a_rates: Sequence[float], b_rates: Sequence[float], seed: int = 0, level: float = 0.95,
                  n_boot: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float, float]:
    """(median, ci_low, ci_high) of mean(B)/mean(A) over whole runs, each run's window throughput one sample,
    resampling the runs of each side.

    Runs of the same settings repeated in separate processes show how reproducible a throughput really is. Steps
    resampled within runs cannot: a loader stalls at regular points (each epoch's worker start-up, a wave of
    slow reads), every window holds about as many stalls, but resampled blocks hold any number of them."""
    a, b = np.asarray(a_rates, dtype=float), np.asarray(b_rates, dtype=float)
    if a.size == 0 or b.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ratio = (b[rng.integers(0, b.size, (n_boot, b.size))].mean(axis=1)
             / a[rng.integers(0, a.size, (n_boot, a.size))].mean(axis=1))
    tail = (1 - level) / 2 * 100
    low, mid, high = np.percentile(ratio, [tail, 50, 100 - tail])
    return float(mid), float(low), float(high)


# Student's t, two-sided 95%, by degrees of freedom (1-30); beyond, the normal's 1.96 is within 2% of it.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


Z95 = 1.959964  # the normal's two-sided 95% quantile


def t95(df: int) -> float:
    """Student's t, two-sided 95%, for `df` degrees of freedom (>= 1)."""
    return _T95[df - 1] if df <= len(_T95) else Z95


def pooled_log_sd(groups: Sequence[Sequence[float]], prior: tuple[float, int] | None = None) -> tuple[float, int]:
    """(sd, degrees of freedom) of the logs of positive values, pooled over the groups that hold two or more
    (each group's own mean removed); (NaN, 0) when none does.

    Used for repeated runs of several settings in one session: how far one run drifts from the next is mostly a
    property of the machine, not of the settings, so settings measured once borrow the spread of those measured
    more often, and the pooled estimate has the degrees of freedom of all of them. `prior` (sd, degrees of
    freedom): a spread known from elsewhere, pooled in as one more group of that many degrees of freedom."""
    squares, df = (prior[0] ** 2 * prior[1], prior[1]) if prior is not None else (0.0, 0)
    for group in groups:
        logs = np.log(np.asarray([v for v in group if v > 0], dtype=float))
        if logs.size >= 2:
            squares += float(np.sum((logs - logs.mean()) ** 2))
            df += logs.size - 1
    return (float(np.sqrt(squares / df)), df) if df else (float("nan"), 0)


def prediction_interval(rates: Sequence[float], spread: tuple[float, int] | None = None,
                        between: float = 0.0) -> tuple[float, float, float]:
    """(centre, low, high): the geometric mean of separate runs' throughputs and the 95% prediction interval of
    one more run, from the spread of their logs (Student's t). Unlike a CI over one window's steps, this covers
    the drift between runs. `spread`: a (log sd, degrees of freedom) pooled over more runs (`pooled_log_sd`),
    used instead of these runs' own; without it, NaNs with fewer than two runs. `between`: the log sd of a level
    that moves between the runs measured and the one predicted and that they cannot show (known from elsewhere,
    so a normal term), added in quadrature."""
    logs = np.log(np.asarray([r for r in rates if r > 0], dtype=float))
    n = logs.size
    if spread is not None and spread[1] >= 1 and n >= 1:
        sd, df = spread
    elif n >= 2:
        sd, df = float(logs.std(ddof=1)), n - 1
    else:
        return float("nan"), float("nan"), float("nan")
    half = np.hypot(t95(df) * sd * np.sqrt(1 + 1 / n), Z95 * between)
    centre = logs.mean()
    return float(np.exp(centre)), float(np.exp(centre - half)), float(np.exp(centre + half))


def between_for_coverage(deviations: Sequence[float], halves: Sequence[float], coverage: float = 0.95) -> float:
    """The smallest `between` (a log sd, as `prediction_interval` takes it) with which intervals of log half-widths
    `halves` around their centres would have held `coverage` of the held-out values at log distances `deviations`
    from them: a split-conformal calibration, each value's score the level it alone needs,
    sqrt(max(0, deviation² - half²)) / Z95, and the answer their ceil((n + 1) × coverage)-th smallest.

    A level estimated by moments assumes the shifts between sessions are normal; on shared machines they are
    heavy-tailed (most sessions move a few %, a few jump 15-40%), so an interval built on a normal level covers
    fewer than it says. The conformal quantile holds its coverage on new sessions like the
    calibration's, whatever the shape. Infinite when n is too small to reach `coverage`; NaN for no values."""
    d, h = np.abs(np.asarray(deviations, dtype=float)), np.asarray(halves, dtype=float)
    if d.size == 0:
        return float("nan")
    scores = np.sort(np.sqrt(np.maximum(0.0, d ** 2 - h ** 2)) / Z95)
    k = math.ceil((d.size + 1) * coverage)
    return float(scores[k - 1]) if k <= d.size else float("inf")


def hodges_lehmann(values: Sequence[float]) -> float:
    """The median of all pairwise means (i <= j, each value with itself included): a centre that one stray value
    moves little (it breaks down only past 29% of them), and that moves smoothly, not by a whole gap, as values
    shift between two clusters. Equal to the mean for two values; NaN for none."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan")
    i, j = np.triu_indices(x.size)
    return float(np.median((x[i] + x[j]) / 2))


# Rounds farther from the rounds' median than this many robust sds (1.4826 x their median absolute deviation, the sd
# of normal rounds) count as if this far before the Walsh averages are taken (`rounds_ratio_interval`).
ROUND_CLIP = 3.0
# The fewest rounds whose CI comes from their Walsh averages (`rounds_ratio_interval`). The interval reaches 95%
# from 6 values (`signed_rank_critical`), but at 6 only as the values' whole range (coverage 1 - 2/64): on normal
# rounds its median width was 1.20x Student's t's (clipped; 4,000 draws), at 7 1.02x, at 8 1.06x.
WALSH_MIN_ROUNDS = 7


@functools.lru_cache(maxsize=None)
def signed_rank_critical(n: int, level: float = 0.95) -> int:
    """The two-sided critical value of Wilcoxon's signed-rank statistic for `n` values: the largest w with
    P(W+ <= w) <= (1 - level) / 2 when each of the 2^n sign patterns of the ranks 1..n is equally likely (W+ the
    sum of the positive ones' ranks), counted exactly by dynamic programming over the ranks (n = 6..10 at 95%:
    0, 2, 3, 5, 8, as tabled). -1 where no w qualifies: below 6 values at 95%, even w = 0 has 2/2^n > 2.5%."""
    top = n * (n + 1) // 2
    ways = [1] + [0] * top  # ways[s]: sign patterns of the ranks so far whose positive ranks sum to s
    for rank in range(1, n + 1):
        for total in range(top, rank - 1, -1):
            ways[total] += ways[total - rank]
    tail, w = 0, -1
    while (tail + ways[w + 1]) <= (1 - level) / 2 * 2 ** n:
        tail += ways[w + 1]
        w += 1
    return w


def walsh_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The Hodges-Lehmann centre's own interval: from the (w+1)-th smallest to the (w+1)-th largest of the Walsh
    averages (pairwise means, i <= j), w = `signed_rank_critical(n, level)`: the signed-rank test inverted, so it
    holds the centre of any continuous symmetric distribution with probability >= `level`, whatever its shape.
    NaNs where n is too small for `level` (below 6 values at 95%)."""
    x = np.asarray(values, dtype=float)
    w = signed_rank_critical(x.size, level) if x.size else -1
    if w < 0:
        return float("nan"), float("nan")
    i, j = np.triu_indices(x.size)
    walsh = np.sort((x[i] + x[j]) / 2)
    return float(walsh[w]), float(walsh[-w - 1])


def _clip_bounds(x: np.ndarray, clip: float) -> tuple[float, float] | None:
    """(low, high): `clip` robust sds (1.4826 x the median absolute deviation) either side of the median of `x`;
    None where the deviation is 0 (over half of them equal: no scale to judge by)."""
    if not x.size:
        return None
    mid = float(np.median(x))
    sd = 1.4826 * float(np.median(np.abs(x - mid)))
    return (mid - clip * sd, mid + clip * sd) if sd > 0 else None


def clip_strays(values: Sequence[float], clip: float = ROUND_CLIP) -> np.ndarray:
    """`values` with those farther than `clip` robust sds (1.4826 x the median absolute deviation) from their
    median pulled in to that distance; unchanged where the deviation is 0 (over half of them equal: no scale to
    judge by)."""
    x = np.asarray(values, dtype=float)
    bounds = _clip_bounds(x, clip)
    return np.clip(x, *bounds) if bounds else x


def stray_rounds(ratios: Sequence[float]) -> np.ndarray:
    """Which of the rounds' (positive) ratios `rounds_ratio_interval` counts nearer than they read (`clip_strays`
    of their logs, from WALSH_MIN_ROUNDS rounds): for a floor from the steps of the other rounds only, as a floor
    pooled over every round's steps swells with a disturbed round's."""
    x = np.log(np.asarray(ratios, dtype=float))
    bounds = _clip_bounds(x, ROUND_CLIP) if x.size >= WALSH_MIN_ROUNDS else None
    return (x < bounds[0]) | (x > bounds[1]) if bounds else np.zeros(x.size, dtype=bool)


def rounds_ratio_interval(ratios: Sequence[float], within: tuple[float, float] | None = None,
                          spread: tuple[float, int] | None = None) -> tuple[float, float, float]:
    """(centre, low, high): the Hodges-Lehmann centre of per-round ratios (each round: both sides measured together)
    and its 95% CI over the rounds (widened to hold the centre), so the drift between rounds counts, not only the
    jitter of steps inside them. Steps within a round are not independent draws (the machine's state carries from
    one to the next), which is why a CI from resampled steps is too narrow (the gate's A/A rounds showed it).

    The centre (`hodges_lehmann` of the log ratios) shrugs off one round that went wrong, as a median does, but
    does not jump between clusters: a setting's fresh processes can settle in one of two states (lstm_collate's
    bf16 recommendation read about 720 or 850 sequences/s, each steady within its process), and the median of
    sixteen rounds then sat on the slow cluster's edge, 1.34x, where twenty re-measured rounds' median sat on the
    fast one, 1.53x; their Hodges-Lehmann centres read 1.41x and 1.47x.

    From WALSH_MIN_ROUNDS rounds the CI is the centre's own (`walsh_interval` of the log ratios), after
    `clip_strays`: rounds more than ROUND_CLIP robust sds from the median count as if that far. The Walsh interval
    alone is as fragile as Student's t at these sizes: its end is the (w+1)-th Walsh average from the top, and one
    stray round sits in n of them, two in 2n - 1, so below 17 rounds two rounds read under a busy neighbour carry an
    end halfway out to them. Clipped, a stray round moves an end by a bounded amount: in simulated rounds (log
    sd 3%, 8-16 of them, two replaced by rounds 3x off, 1,000 draws each) the CI's width grew 1.6-2.2x at the
    median and at most 3.1x in 95% of draws (at 10 rounds 2.1x and 2.8x: the stated bound is 3x), where Student's t
    grew 13-18x and the plain Walsh interval 12-16x. On rounds without strays the clip rarely acts; it costs about
    a point of coverage where the median deviation happens to be small (94-95% in 10,000 draws of normal rounds,
    7-16 of them, against the plain interval's >= 95%).

    Below WALSH_MIN_ROUNDS the CI is the geometric mean's with Student's t: below 6 rounds no distribution-free
    interval reaches 95% (even the widest, the rounds' range, covers 1 - 2/2^n), at 6 it is the range, a fifth
    wider than t's on normal rounds (a planner's six duels in turn would clear 1 less often), and so few rounds
    give no robust scale that tells a stray round from the spread itself: a round that went wrong then widens it,
    honestly, and a confirmation whose CI is wider than ±5% runs more rounds while its budget allows
    (planner/confirm.py), up to where strays are clipped. There `spread`, a (log sd, degrees of freedom) pooled
    over more repeated comparisons, is used instead of the rounds' own when it has more degrees of freedom; from
    WALSH_MIN_ROUNDS rounds the rounds need no borrowed spread (and an sd pooled over groups swells with any
    disturbed one among them). `within` (low, high): the CI from the rounds' steps, a floor: a round-to-round
    spread that happens to be small cannot make the interval narrower than the steps allow (one pooled over every
    round's steps swells with a disturbed round as Student's t does: take it over the rounds that `stray_rounds`
    leaves; NaN where the steps were too few to resample, `resamples`: no floor). With one round and no pooled
    spread, `within` is the interval; NaNs without either."""
    if within is not None and not np.all(np.isfinite(within)):
        within = None
    logs = np.log(np.asarray([r for r in ratios if r > 0], dtype=float))
    n = logs.size
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    centre = float(np.exp(hodges_lehmann(logs)))
    own = (float(logs.std(ddof=1)), n - 1) if n >= 2 else (float("nan"), 0)
    sd, df = spread if spread is not None and spread[1] > own[1] else own
    if n >= WALSH_MIN_ROUNDS:
        low, high = np.exp(walsh_interval(clip_strays(logs)))
        low, high = float(low), float(high)
    elif df >= 1:
        half = t95(df) * sd / np.sqrt(n)
        low, high = float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
    elif within is None:
        return centre, float("nan"), float("nan")
    else:
        low, high = within
    if within is not None:
        low, high = min(low, within[0]), max(high, within[1])
    return centre, min(low, centre), max(high, centre)


def rounds_with_prior(ratios: Sequence[float]) -> tuple[float, float, float]:
    """`rounds_ratio_interval` of `ratios`, each one measurement of the ratio (a round, a pair, two probes), their
    own spread pooled with ROUND_SPREAD's: so one measurement has an interval, and a few do not rest on their own
    one or two degrees of freedom alone."""
    return rounds_ratio_interval(ratios, spread=pooled_log_sd([ratios], (ROUND_SPREAD, ROUND_SPREAD_DF)))
