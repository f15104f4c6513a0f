"""Comparing settings under noise: the gain of one over another, when a gain counts, and what it rests on.

Functions of the probe ledger (planner/ledger.py: the probes, duels and lockstep wins of a plan) that write nothing
back (the statistics they rest on are in planner/ratios.py). The bounds below are the keep rule's, which
`Session.beats` applies while it measures again. Why they are where they are: docs/planner.md, "Deciding under
noise".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import knobs
from ..analysis import stats
from ..probe.result import ProbeResult
from .keep import MIN_GAIN
from .ratios import pair_ratio, settings_key, window_rate


Gain = tuple[float, float, float]  # (median, ci_low, ci_high) of a throughput ratio

# Separate probes seconds apart can run in different speed states of a shared machine, so their ratio alone does
# not decide a change between these bounds: a probe pair measured in lockstep (Session.duel) does. Below DUEL_FROM
# the change is dropped; from a median of CLEAR_GAIN it is kept without one, if its CI also clears the minimum
# gain: no swing of the machine makes that much.
DUEL_FROM = 0.9
LOADER_DUEL_FROM = 0.75  # a loader-bound pipeline is bursty: its short screening probes swing further
# persistent_workers and prefetch_factor change when the loader's workers run, not what the training step computes,
# so a screen of one whose step, outside its data wait, took this many times its reference's per item ran beside
# something else on the machine (`disturbed`), and is measured again rather than dropped: one 1-minute io_bound run
# screened persistent workers at 0.62x of 32 workers, its step computing 8.7x as long per item (waiting 25% where
# its reference waited 86%), and dropped them; undisturbed runs read them 1.9-2.0x.
DISTURBED_COMPUTE = 2.0
CLEAR_GAIN = 1.5
# A duel's probes measure at most this long: a lockstep ratio that can settle does so in a second or two, and a
# duel in turn adds one run to each side's runs, whose spread measures the noise (a loader-bound probe would
# otherwise extend to its cap).
DUEL_MAX_S = 4.0
MAX_DUELS = 3  # per comparison: a gain still inconclusive after a duel earns another, up to this many
# ... and up to this many for a gain over the baseline while the plan is in the first half of its budget: until a
# change is kept, an open comparison decides whether the run has any advice at all, and a plan that ends with most
# of its budget unused on one has wasted the user's wait. One augment_cpu run read 2 loader workers over none at
# 1.08x, 1.10x and 1.02x in three rounds in turn (t: about [0.97, 1.17]), kept nothing and, its step 96% waiting for
# data, ended at 33 s of 180 (its twin run kept 2 workers, the grid's best). Past the first kept change the later
# knobs use the budget anyway: two hf_trainer runs spent a fourth duel each on 2 loader workers over 1 (rounds
# 1.12x, 1.09x, 0.91x, then 0.88x) and had no budget left for batch 32 with 2 workers, the grid's best. Further
# looks while the gain stays promising let noise through a little more often than one test would (a false 3% gain
# needs a run of lucky rounds past the 95% bound); the ablation and the confirmation measure every kept change again.
MAX_DUELS_AMPLE = 6
# ... and a plan's second look (nothing else left to explore) goes on past them, up to this many, while the gain stays
# promising and the budget affords it: one 2-minute augment_cpu run read its 2 loader workers over none at 1.11x
# [0.98, 1.32] over six rounds in turn, kept the baseline and ended at 61 s, half its budget unused; its 5-minute
# run kept them, and with them batch 128 and the fused optimizer (1.73x). At a round's log spread of about 0.15,
# a true 1.11x clears 1 after about ten rounds.
MAX_DUELS_SECOND_LOOK = 16
MIN_RUNS = 3  # runs per side from which their spread, not the steps', measures the noise (duels in turn add them)
# Duels in turn from which their rounds decide (Student's t over the rounds' ratios: two rounds are rarely enough,
# so an inconclusive second earns a third): a round's two runs are seconds apart, so the machine's slower swings
# cancel in its ratio, where separate runs carry them. One hf_trainer run kept 1 loader worker over 2 after three
# rounds in turn read 2 workers 1.07x, 1.08x and 1.12x faster (t: [1.03, 1.16]): over the six runs unpaired
# (12,428-16,109 samples/s) the gain was not beyond the noise.
MIN_ROUNDS_IN_TURN = 2
# Duels a comparison gets, at least, while it cannot tell: its CI reaches below 1 and past the minimum gain. A first
# duel can read a loss from one bad stretch: one augment_cpu run measured batch 128 beside 64 (two loader workers a
# side, a pair capped at a screen's 3 s) at 0.92x [0.73, 1.11] and ended its ladder there; that run's twin measured
# the same two at 1.27x and 1.21x, and batch 128 was the grid's best, 14% ahead of 64.
MIN_DUELS_UNDECIDED = 2
# The spread behind the loader bars (`least_told_in_turn`): the rounds' prior (stats.ROUND_SPREAD) before 108
# confirmations lowered it to 0.08. The bars were set at it against measured runs (lightning_module's persistent
# workers bounded at 1.13-1.19x, hf_trainer's 4 workers at 1.08-1.12x) and stay: a loader rung's ceiling is its most,
# rarely approached, so it needs room above what duels can tell.
CEILING_SPREAD = 0.11


def gain(ledger, reference: ProbeResult, candidate: ProbeResult) -> Gain:
    """Throughput ratio candidate/reference: (median, ci_low, ci_high); NaNs when either failed. From their
    lockstep duels when they had one (each step beside its partner); else from MIN_ROUNDS_IN_TURN or more
    duels in turn, over the rounds' ratios at the spread the run's duels in turn show (`in_turn_drift`); else,
    with MIN_RUNS runs or more of each, over the runs (each run's throughput one sample); else over their pooled
    steps."""
    if not (reference.ok and candidate.ok):
        return float("nan"), float("nan"), float("nan")
    duels = lockstep(ledger, reference, candidate)
    if duels:
        found = pair_ratio(duels, waves=(reference.wave, candidate.wave))
        # too few turns for their loader's waves to resample (stats.resamples): each pair is one measurement
        return found if found[1] == found[1] else _as_rounds(duels)
    rounds = in_turn(ledger, reference, candidate)
    if len(rounds) >= MIN_ROUNDS_IN_TURN:
        # their spread pooled with the run's other duels in turn and EXPLORATION_SPREAD (`in_turn_drift`): alone,
        # two duels left one degree of freedom (t = 12.7), and a 1-minute io_bound run read 32 loader workers 1.29x
        # and 1.39x of 8 in two and kept 8 (its reference, 32 with persistent workers, 26x the baseline to 8's 8x)
        return _as_rounds(rounds, in_turn_drift(ledger))
    paired = common_kind(ledger, reference.settings, candidate.settings)
    if paired is None:
        return float("nan"), float("nan"), float("nan")
    runs = [[window_rate(p) for p in ledger.runs(side.settings, paired)] for side in (reference, candidate)]
    if min(map(len, runs)) >= MIN_RUNS:  # enough separate runs to see how reproducible each side is
        return stats.runs_ratio_ci(*runs)
    found = stats.ratio_ci(*ledger.samples(reference.settings, paired), *ledger.samples(candidate.settings, paired),
                           seed=0, waves=(reference.wave, candidate.wave))
    return found if found[1] == found[1] else stats.rounds_with_prior([found[0]])


def _as_rounds(pairs: list[tuple[ProbeResult, ProbeResult]], spread: tuple[float, int] | None = None) -> Gain:
    """The gain over (reference, candidate) pairs taken as rounds, one ratio of windows each, at `spread` (log sd,
    degrees of freedom: `stats.rounds_ratio_interval`), else at their own spread pooled with ROUND_SPREAD
    (`stats.rounds_with_prior`)."""
    ratios = [window_rate(b) / window_rate(a) for a, b in pairs if a.ok and b.ok and a.measured and b.measured]
    return stats.rounds_with_prior(ratios) if spread is None else stats.rounds_ratio_interval(ratios, spread=spread)


def clears(gain: Gain) -> bool:
    """The keep rule: a gain of at least MIN_GAIN whose 95% CI excludes 1."""
    median, low, _ = gain
    return median >= 1 + MIN_GAIN and low > 1.0


def dueled(ledger, reference: ProbeResult, candidate: ProbeResult) -> bool:
    """Whether the two were measured again together, both sides to the end (a pair whose one side failed
    compared nothing)."""
    return any(a.ok and b.ok for a, b in duels_of(ledger, reference, candidate))


def open_gains(ledger, reference: ProbeResult) -> list[ProbeResult]:
    """The settings dueled as candidates against `reference` whose gain over it is still open: promising (at
    least MIN_GAIN at the median) with a CI that reaches 1, with fewer than MAX_DUELS_SECOND_LOOK duels so far,
    or, with fewer than MAX_DUELS_AMPLE, a CI that reaches from below 1 past MIN_GAIN at a median from DUEL_FROM
    (one augment_cpu run read 2 loader workers over none at 0.97x, 1.29x and 0.94x in three rounds in turn, kept
    nothing and ended at 28 s of its 180; the grid put 2 workers 1.2-1.4x over none). Highest median first; each
    as its first probe of those settings."""
    ref = settings_key(reference.settings)
    found = []
    for (a, b), pairs in ledger.duels.items():
        if a != ref or b == ref or len(pairs) >= MAX_DUELS_SECOND_LOOK:
            continue
        candidate = ledger.seen(dict(b))
        if candidate is None or not candidate.ok:
            continue
        median, low, high = gain(ledger, reference, candidate)
        if promising(median, low) or (len(pairs) < MAX_DUELS_AMPLE and median >= DUEL_FROM and untold(low, high)):
            found.append((median, candidate))
    return [c for _, c in sorted(found, key=lambda mc: -mc[0])]


def chained_gain(ledger, reference: ProbeResult, candidate: ProbeResult) -> Gain | None:
    """The gain candidate/reference over a chain of lockstep wins (`ledger.wins`), reference -> ... -> candidate (a
    ladder's rungs, each kept in a lockstep duel), or None without one or where the two won a duel of their own:
    the ratios multiply, and the half-widths of their log CIs add in quadrature (the duels are independent
    measurements). The shortest such chain (fewest duels, least added noise). It spares the ladder's start and
    end a duel of their own."""
    wins, start = ledger.wins, settings_key(reference.settings)
    key = settings_key(candidate.settings)
    if start in wins.get(key, {}):
        return None  # one link is the direct comparison
    links_to: dict[tuple, list[Gain]] = {key: []}
    frontier = [key]
    while frontier and start not in links_to:  # breadth first: the first chain found is a shortest one
        following = []
        for node in frontier:
            for previous, link in wins.get(node, {}).items():
                if previous not in links_to:
                    links_to[previous] = links_to[node] + [link]
                    following.append(previous)
        frontier = following
    if start not in links_to:
        return None
    logs = np.log(np.array(links_to[start]))  # rows: (median, low, high)
    half = np.sqrt(np.sum(((logs[:, 2] - logs[:, 1]) / 2) ** 2))
    centre = logs[:, 0].sum()
    return float(np.exp(centre)), float(np.exp(centre - half)), float(np.exp(centre + half))


def duel_count(ledger, reference: ProbeResult, candidate: ProbeResult) -> int:
    """How often these two settings were measured again together, whichever side each was run as."""
    return len(duels_of(ledger, reference, candidate))


def asked(ledger, reference: ProbeResult, candidate: ProbeResult) -> int:
    """How often `candidate` was measured again beside `reference` as the reference side."""
    return len(ledger.duels.get((settings_key(reference.settings), settings_key(candidate.settings)), []))


def lockstep(ledger, reference: ProbeResult, candidate: ProbeResult) -> list | None:
    """The lockstep duels of these two as (reference, candidate) pairs, whichever side each was run as, if
    every one of them ran in lockstep."""
    duels = duels_of(ledger, reference, candidate)
    return duels if duels and all("lockstep" in r.extra for pair in duels for r in pair) else None


def duels_of(ledger, reference: ProbeResult, candidate: ProbeResult) -> list[tuple[ProbeResult, ProbeResult]]:
    """Every duel of these two settings as (reference, candidate) pairs, whichever side each was run as."""
    ref, cand = settings_key(reference.settings), settings_key(candidate.settings)
    return ledger.duels.get((ref, cand), []) + [(b, a) for a, b in ledger.duels.get((cand, ref), [])]


def in_turn(ledger, reference: ProbeResult, candidate: ProbeResult) -> list[tuple[ProbeResult, ProbeResult]]:
    """The duels of these two run one after the other (not in lockstep), both sides measured, as (reference,
    candidate) pairs."""
    return [(a, b) for a, b in duels_of(ledger, reference, candidate)
            if all(r.ok and r.measured and "lockstep" not in r.extra for r in (a, b))]


def common_kind(ledger, *settings: dict[str, Any]) -> bool | None:
    """The kind of measure (paired: True, alone: False) that every one of `settings` has; alone where both
    kinds do; None where none is common."""
    for paired in (False, True):
        if all(ledger.runs(s, paired) for s in settings):
            return paired
    return None


def disturbed(reference: ProbeResult, candidate: ProbeResult) -> bool:
    """Whether one of two probes differing only in when the loader's workers run (knobs.LOADER_KNOBS) computed
    DISTURBED_COMPUTE times as long per item outside its data wait as the other: the machine, not the setting."""
    changed = {k for k in {*reference.settings, *candidate.settings}
               if reference.settings.get(k) != candidate.settings.get(k)}
    if not changed or not changed <= set(knobs.LOADER_KNOBS):
        return False
    a, b = (compute_s(p) / sum(p.items) if sum(p.items) > 0 else 0.0 for p in (reference, candidate))
    return a > 0 and b > 0 and max(a, b) > DISTURBED_COMPUTE * min(a, b)


def compute_s(probe: ProbeResult) -> float:
    """Seconds of `probe`'s measured steps outside their data wait; 0 where it measured none."""
    return sum(probe.step_s) * (1 - (probe.data_wait_frac() or 0.0)) if probe.ok and probe.step_s else 0.0


def gain_pairs(ledger, reference: ProbeResult, candidate: ProbeResult) -> tuple[str, list[tuple[str, str]]]:
    """How `gain` measured the two ("lockstep", "in turn", or "separately") and the (reference, candidate) probe
    ids it rests on."""
    if duels := lockstep(ledger, reference, candidate):
        return "lockstep", [(a.id, b.id) for a, b in duels]
    if len(rounds := in_turn(ledger, reference, candidate)) >= MIN_ROUNDS_IN_TURN:
        return "in turn", [(a.id, b.id) for a, b in rounds]
    return "separately", [(reference.id, candidate.id)]


def describe_gain(ledger, reference: ProbeResult, candidate: ProbeResult, chained: bool = False) -> str:
    """The gain with its CI and where it comes from (`chained`: over the chain of lockstep wins)."""
    median, low, high = (chained_gain(ledger, reference, candidate) if chained
                         else gain(ledger, reference, candidate))
    if median != median:
        return f"{candidate.status.value}"
    kind, pairs = gain_pairs(ledger, reference, candidate)
    ids = " & ".join(f"{a}/{b}" for a, b in pairs)
    if chained:
        how = "over its chain of ladder wins in lockstep"
    elif kind == "lockstep":
        how = f"in lockstep, {ids}"
    elif kind == "in turn":
        how = f"over {len(pairs)} rounds in turn, {ids}"
    else:
        how = f"over {reference.id}"
    return f"{median:.2f}x [{low:.2f}, {high:.2f}] {how}"


def lockstep_drift(ledger, prior: tuple[float, int] | None = None) -> tuple[float, int]:
    """(log sd, degrees of freedom) of the round-to-round spread of lockstep ratios, pooled over every pair of
    settings compared in lockstep more than once (duels, confirmation rounds), and over `prior` (a spread known
    from elsewhere, with its degrees of freedom) where given."""
    groups = []
    for pairs in ledger.duels.values():
        done = [(a, b) for a, b in pairs if a.ok and b.ok and "lockstep" in a.extra and "lockstep" in b.extra]
        groups.append([window_rate(b) / window_rate(a) for a, b in done])
    return stats.pooled_log_sd(groups, prior)


def in_turn_drift(ledger) -> tuple[float, int]:
    """(log sd, degrees of freedom) of the round-to-round spread of ratios in turn, pooled over every pair of
    settings the search dueled in turn (each pair's own mean removed) and over stats.EXPLORATION_SPREAD: the
    `lockstep_drift` of duels in turn. A ratio of runs seconds apart cancels the machine's slower swings, which
    the spread of one setting's repeats would carry (a speed that moved between duels read as noise)."""
    groups = [[window_rate(b) / window_rate(a) for a, b in pairs
               if all(r.ok and r.measured and "lockstep" not in r.extra for r in (a, b))]
              for pairs in ledger.duels.values()]
    return stats.pooled_log_sd(groups, (stats.EXPLORATION_SPREAD, stats.EXPLORATION_SPREAD_DF))


def promising(median: float, low: float) -> bool:
    """Whether a gain is worth keeping at its median (MIN_GAIN) but not yet beyond the noise (its CI reaches 1)."""
    return median >= 1 + MIN_GAIN and low <= 1.0


def tellable_in_turn(ledger, reference: ProbeResult, candidate: ProbeResult, rounds: int) -> bool:
    """Whether the duels in turn of these two, were the gain their rounds read so far to hold, would keep it
    (`clears`) within `rounds` of them at the spread the run's duels in turn show (`in_turn_drift`, these rounds in
    it): rounds that agree near a gain worth keeping are worth a few more; rounds that scatter around a small one
    are not. A 2-minute lightning_module run read persistent workers over 4 workers at 1.10x, 1.06x and 1.10x in
    three rounds in turn, [0.99, 1.18] at the pooled spread (one more such round clears 1), stopped there
    (MAX_DUELS), spent its next 60 s on prefetch_factor, bf16 and a batch ladder (none beyond the noise) and kept 4
    workers alone, 7.6% short of its 5-minute run; two hf_trainer runs' rounds of 1.12x, 1.09x and 0.91x would
    need dozens."""
    pairs = in_turn(ledger, reference, candidate)
    if len(pairs) < MIN_ROUNDS_IN_TURN or len(pairs) >= rounds:
        return False
    spread = in_turn_drift(ledger)
    median, _, _ = _as_rounds(pairs, spread)
    sd, df = spread
    more = rounds - len(pairs)
    return bool(median >= 1 + MIN_GAIN and stats.t95(df + more) * sd / np.sqrt(rounds) < np.log(median))


def untold(low: float, high: float) -> bool:
    """Whether a gain's CI cannot yet tell a loss from a gain worth keeping: it reaches below 1 and past MIN_GAIN."""
    return low < 1.0 and high > 1 + MIN_GAIN


def least_told_in_turn(rounds: int) -> float:
    """The least gain that `rounds` duels in turn could keep (`clears`) at CEILING_SPREAD pooled with their own
    spread at its least, nil: a bar for a loader rung's most it can gain (its wait share), not the judge of its
    duels (`gain`, at the run's `in_turn_drift`). That ceiling is rarely approached: on 2 cores a raw_sensor_mlp
    run's 2 workers read 0.63x under a 1.14x ceiling and an hf_trainer run's 4 workers 1.02x under 1.10x; at the
    exploration prior's lower bar those rungs ran, 13-25 s, and compile was left over budget. A gain that cannot
    be larger is not worth their time."""
    df = rounds - 1 + stats.ROUND_SPREAD_DF
    sd = CEILING_SPREAD * np.sqrt(stats.ROUND_SPREAD_DF / df)
    return max(1 + MIN_GAIN, float(np.exp(stats.t95(df) * sd / np.sqrt(rounds))))
