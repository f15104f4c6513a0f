"""The confirmation: baseline and winner measured again, together, for the speedup the report states, and
each alone, for the figures it prints. `session` is the planner's Session (planner/session.py): it runs the probes,
its ledger holds them, its budget says what still fits."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import knobs
from ..analysis import stats
from ..analysis.stats import ROUND_SPREAD, ROUND_SPREAD_DF
from ..probe.result import ProbeResult, Status
from . import figures
from .compare import DUEL_MAX_S, lockstep_drift, promising
from .ratios import pair_ratio, plain_wall, window_rate
from .keep import MIN_GAIN

# Baseline and winner measured together in lockstep, three rounds (the first mover alternates): the speedup's CI
# uses Student's t over the rounds, and two rounds leave one degree of freedom (t = 12.7). A third round is run
# while the budget allows it; two are the least, but for a gain one round tells from the noise (`rounds_to_tell`).
CONFIRM_ROUNDS = 3
CONFIRM_MIN_ROUNDS = 2
# Each round is a fresh pair of processes, and some workloads read differently from one process to the next (an
# LSTM over padded batches: rounds of one confirmation ranged 1.30-1.83x). The headline is the figure a user acts
# on, so while its CI is wider than ±CONFIRM_PRECISION and the budget allows, more rounds are run, up to
# CONFIRM_MAX_ROUNDS: at the default budget most plans end minutes early, and the rounds use that time.
CONFIRM_MAX_ROUNDS = 8
# Rounds one after the other carry the machine's swings into each ratio (lockstep rounds share them), so they get
# twice the cap, still only while the CI is wide and the budget allows: one varlen_transformer run measured batch 64
# at 1.17x [1.11, 1.23] in a lockstep duel, then 1.10x [0.91, 1.21] over 8 rounds in turn (0.82x to 1.28x), and
# kept the baseline with two thirds of its budget unused; its twin run confirmed 1.17x [1.09, 1.26].
CONFIRM_MAX_ROUNDS_IN_TURN = 16
# ... as do lockstep rounds in timed turns (steps far apart, below): on tiny_batch_mlp each side's level differs
# from one fresh process to the next whatever the pairing (batch 4 read 130, 161 and 195 samples/s in three
# lockstep rounds of one confirmation, 3 s a side), so their rounds count as rounds in turn do.
CONFIRM_PRECISION = 0.05
# In a lockstep pair each side's step starts where its partner's left the caches and the core: a cost per turn that
# weighs more on the side with the shorter turns, so a pair whose steps differ a lot reads the longer-step side
# high. Measured against the same two settings alone (benchmarks/lockstep_bias.py; docs/planner.md): lstm_collate
# at batch 32 (steps 1.25x the baseline's) 0.3% low, varlen_transformer at batch 64 (1.75x) 5.3% high over 18
# rounds, cnn at batch 128 (4.1x) 6.5% high, lstm_collate at batch 256 (10.7x) 5.8% high. Beyond this ratio of
# median step times the confirmation gives each side turns of about CONFIRM_TURN_S (Protocol.turn_s), which spread
# that cost over half a second rather than one step: against the two alone (6 rounds, Intel Xeon, 2026-11-27)
# tiny_batch_mlp at batch 512 + fused optimizer (steps 3.1x apart) read 0.988 [0.886, 1.101], cnn at batch 128
# (4.2x) 0.990 [0.928, 1.057]. Rounds in turn, the alternative, share no moments, and their ratios spread about
# twice as far (tiny_batch_mlp: a log sd of 0.045 for rounds of half-second turns, 0.09-0.11 in turn), which the
# headline's CI pays for in rounds: twelve confirmations of 8 rounds in turn, back to back, agreed within ±5% of
# the next in 7 of 11 (benchmarks/confirm_rounds.py --blocks; docs/planner.md).
LOCKSTEP_MAX_STEP_RATIO = 1.5
CONFIRM_TURN_S = 0.5
# Rounds in turn share no moments, so what makes their CI narrow is how many there are, not how long each side
# measures: on augment_cpu (batch 128 + 2 workers against the baseline, 8 rounds per cap, interleaved:
# benchmarks/confirm_rounds.py) rounds with windows capped at 4 s read with a log sd of 0.151 in 5.7 s a round,
# capped at 8 s 0.140 in 7.0 s: the same spread per second spent. So a side measures at most CONFIRM_TURN_WINDOW_S
# in a round in turn (a duel's cap).
CONFIRM_TURN_WINDOW_S = DUEL_MAX_S
ROUND_ROLES = ("confirm:baseline", "confirm:recommended")  # a round's two sides (the runs alone: "confirm:alone:...")
# Then each of the two once more alone, so that its printed figure rests on separate runs of the kind training sees
# (a lockstep partner's turns leave the caches cold) and its interval on the drift between them.
CONFIRM_ALONE = 1
CONFIRM_RESERVE = 2 * CONFIRM_MIN_ROUNDS  # probes kept back from the budget for the confirmation (the runs alone: if
# time is left; without them the figures come from the rounds: planner/figures.py)
# Once a gain is kept, the plan keeps back the rounds that could tell it from noise at ROUND_SPREAD
# (`rounds_to_tell`), up to this many, not CONFIRM_MIN_ROUNDS alone: two rounds confirm only a large gain (see
# ROUND_SPREAD), and a 1-minute varlen_transformer run spent the time a third round needed on its ablation pairs, then
# read its batch 64 + fused optimizer at 1.15x and 1.14x in two lockstep rounds and kept the baseline.
RESERVE_MAX_ROUNDS = 6
# ... and rounds enough that their CI clears 1 in four of five confirmations of a true gain that large (80% power:
# the normal quantile 0.84 added to Student's t), not in one of two: kept back at the fewest rounds whose CI clears
# 1 exactly at the kept gain, varlen_transformer's shape in the planner's tests (batch 64 and the fused optimizer,
# 1.1x each, steps ±10%) kept back two rounds for its 1.23x, spent the rest on an ablation pair, and kept the
# baseline.
CONFIRM_POWER_Z = 0.84
# The confirmation may run this far past --budget (the contract is "within 10%"): it is what the recommendation
# rests on, and its probes' wall times vary with the machine's speed. Exploring probes stop where it must begin.
CONFIRM_GRACE = 0.05
# A shared machine changes its mood over minutes, and two settings feel it differently, so a ratio measured in one
# minute can sit 10% off the next minute's: a tiny_batch_mlp confirmation read 41.98x [40.03, 43.49] over 5 rounds
# in about a minute and its re-measure minutes later 46.64x [44.22, 48.61]; a varlen_transformer one stopped
# after 4 rounds in 30 s at 1.13x [1.08, 1.17] (rounds 1.10-1.15) and re-measured at 1.25x, while 12 rounds of the
# same pair (benchmarks/lockstep_bias.py --timed-only --window-s 4) read 1.15-1.29 (Intel Xeon, 2 cores,
# 2026-11-27; docs/planner.md). Both plans had ended with most of the budget unused. So rounds count as precise
# only once they span this share of --budget (at the default 10 min: 2 min), while the budget allows them and up
# to the caps above: a headline resting on rounds spread over minutes sees the moods its re-measure will meet.
# Step-by-step lockstep rounds pass CONFIRM_MAX_ROUNDS for this too, up to CONFIRM_MAX_ROUNDS_IN_TURN (never in
# the grace): a lstm_collate confirmation (batch 32 + bf16, AMD EPYC, 2026-11-27) stopped at 8 such rounds within
# seconds at 1.27x [1.26, 1.29], the run ending at 61 s of 600, and its re-measure minutes later read 1.43x.
CONFIRM_SPAN_SHARE = 0.2
# The first mover alternates so that an advantage of going first hits both sides alike; it need not be symmetric.
# On an AMD EPYC (2 cores, 2026-11-27) a lstm_collate confirmation in timed turns read the bf16 recommendation at
# 855-883 sequences/s in each of the eight rounds where it moved first and 736-761 in each of the eight where the
# baseline did (the baseline near 570 either way): 1.52x against 1.30x, and alone it read 866 (cause not found;
# docs/planner.md). Where the rounds fall apart by who went first with no overlap, each side holding at least this
# many (by chance 2 in C(2n, n): 1 in 126 at five and five), the interval is widened to hold both halves' centres
# and a note says so: the protocol itself, not the machine, then decides where the figure lands.
FIRST_MOVER_MIN_ROUNDS = 5
# Each probe of the confirmation forks from a zygote started for it (ProbeSpec.fresh_parent). A zygote's children
# share its memory layout, and that can set a setting's level: on tiny_batch_mlp's baseline (batch 4: AdamW's
# 16 MB temporaries freed and faulted in again each step) the children of one zygote read 29-32 ms a step while
# those of the other read 25-26, in each of three processes (AMD EPYC, 2026-11-28); with address-space
# randomisation off, 25.9 and 25.0. The planner forks the first mover from slot 0, so its confirmations split by
# who went first (the baseline at ~157 samples/s first, ~133 second; ~163 alone) and four of four read their
# headline 9-17% above the re-measure in fresh processes. A new zygote per probe makes a zygote's layout one more
# draw that the rounds average and their CI counts. Its cost, importing torch (2.1 s on 2 cores:
# `backend.fresh_parent_s`; a lockstep pair's two zygotes start side by side before either side forks), is not
# kept back from the search: a round or run alone forks from new zygotes where the budget left holds their start,
# from the long-lived ones otherwise (a short --budget loses no rung).
CONFIRM_FRESH_PARENTS = True  # off only where the tests' short confirmations skip that cost (tests/conftest.py)


def confirm(session, base: ProbeResult, winner: ProbeResult,
            notes: list[str]) -> tuple[ProbeResult, dict[str, Any] | None, dict[str, Any] | None]:
    """Measure baseline and winner together in lockstep rounds (CONFIRM_MIN_ROUNDS, then up to CONFIRM_ROUNDS
    while the budget allows, and on up to CONFIRM_MAX_ROUNDS (rounds in turn: up to CONFIRM_MAX_ROUNDS_IN_TURN,
    each side's window capped; in timed turns: up to that too) while the
    speedup's CI is wider than ±CONFIRM_PRECISION or the rounds span less than CONFIRM_SPAN_SHARE of the budget
    (step by step, up to CONFIRM_MAX_ROUNDS_IN_TURN for that span, within the budget);
    the first mover alternates): drift hits both alike. Then, where time is left,
    each once more alone, for the figures the report prints. Returns (recommended, speedup, unconfirmed); the speedup
    is None when the baseline stays recommended (a speedup beside unchanged settings would be one the report does
    not recommend): what the confirmation measured then is in a note and in `unconfirmed` (the function below),
    which is None otherwise.

    The speedup is the Hodges-Lehmann centre of the rounds' ratios with a 95% CI over the rounds
    (`stats.rounds_ratio_interval`): from seven rounds the centre's own interval from their pairwise means, stray
    rounds clipped so that one or two read under a busy neighbour do not swing it; below seven, Student's t over
    their geometric mean, their spread pooled with a borrowed one (`_pooled_spread`). Widened to hold the centre,
    and to hold both halves' centres where the rounds split by who went first (`first_mover_split`), so it covers
    the drift between rounds.
    The winner stays recommended only if that CI shows a gain beyond the noise too. A round that fails (the budget
    ran out in it, say) leaves the rounds before it to decide, with a note.

    `session` is the planner's Session (planner/session.py).
    """
    rounds, timed, ran_out, short = _rounds(session, base, winner)
    if ran_out:
        notes.append(f"the confirmation's lockstep round ended when {ran_out.id}'s training ended by itself (a script "
                     "that ran out of epochs), before its partner had measured enough: its rounds ran one after the "
                     "other instead")
    failed = min((r for pair in rounds for r in pair if not r.ok), default=None, key=lambda r: r.stopped_by_partner)
    finished = _finished(rounds)
    if failed is not None:
        keeps = (f"the speedup comes from the {len(finished)} round{'s' if len(finished) != 1 else ''} that "
                 "finished" if finished else "keeping the baseline")
        # A probe the budget (or its partner's end) cut short did not fail (Status.STOPPED): say so, as the report's
        # "Stopped before a whole window" list does.
        what = (f"did not finish ({failed.error})" if failed.status is Status.STOPPED
                else f"failed ({failed.status.value}: {failed.error})")
        notes.append(f"confirmation probe {failed.id} {what}; {keeps}")
        if not finished:
            return base, None, None
    speedup = _speedup(session, rounds, base, winner, timed, notes)
    differs = compile_disagreement(session.ledger.probes, [b for _, b in rounds], winner.settings)
    if differs:
        notes.append(differs)
    speedup["probes"] += _alone(session, base, winner)
    median, low, high = (speedup[k] for k in ("median", "ci_low", "ci_high"))
    if not (median >= 1 + MIN_GAIN and low > 1.0):
        notes.append(f"the confirmation measured {median:.2f}x [{low:.2f}, {high:.2f}] for "
                     f"{knobs.describe(winner.settings, base.settings)}: within noise, so the baseline "
                     "stays recommended")
        short = short and promising(median, low)
        if short:  # more time would have run the rounds that tell (planner/budget.py `more_time` reads this)
            session.ledger.unexplored.append(f"{knobs.describe(winner.settings, base.settings)}: its confirmation's "
                                             "further rounds over budget")
        return base, None, unconfirmed(base, winner, speedup, short)
    return winner, speedup, None


def unconfirmed(base: ProbeResult, winner: ProbeResult, speedup: dict[str, Any], short: bool) -> dict[str, Any]:
    """results.json `unconfirmed`: the winner a complete run's confirmation measured but could not tell from the
    noise, so that the verdict says what it measured rather than only that nothing beat the baseline: its probe,
    what it changes, the confirmation's speedup, and `budget_short`, whether the budget ended rounds that still
    read a gain worth keeping (more time would tell). A 1-minute cnn run confirmed batch 64 + channels_last at
    1.14x [0.94, 1.38] in two rounds; its report said only "no change beat the baseline by more than the measured
    noise", and its 3-minute run kept them."""
    return {"probe": winner.id, "changes": knobs.changes(winner.settings, base.settings),
            "speedup": speedup, "budget_short": short}


def _rounds(session, base: ProbeResult, winner: ProbeResult
            ) -> tuple[list[tuple[ProbeResult, ProbeResult]], bool, ProbeResult | None, bool]:
    """The confirmation's rounds, as many as `confirm`'s rules ask and the budget allows; whether they ran in timed
    turns; the side whose training ended by itself in a lockstep round before its partner had measured enough
    (None if none): the rounds then run one after the other, where each side measures what its training holds;
    and whether the budget ended the rounds where `confirm`'s rules asked for another."""
    rounds: list[tuple[ProbeResult, ProbeResult]] = []
    started = session.budget.elapsed()
    turn, timed = _kind(session.pairs(base, winner), base, winner)
    ran_out = None
    least = min(CONFIRM_MIN_ROUNDS, rounds_to_tell(session.ledger.kept_gain(winner)))  # run whatever the budget
    for i in range(CONFIRM_MAX_ROUNDS_IN_TURN):
        if i >= CONFIRM_MAX_ROUNDS and not timed and all("lockstep" in r.extra for pair in rounds for r in pair) and (
                _spanned(session, started) or not _affords_round(session, base, winner, turn, grace=False)):
            break
        # while the rounds so far cannot tell the gain from noise, a round goes before the runs alone: those only
        # print the figures, and without them the figures come from the rounds (planner/figures.py)
        alone = i < least or not _undecided(session, rounds, base, winner, timed)
        if i >= least and not _affords_round(session, base, winner, turn, alone=alone):
            return rounds, timed, ran_out, True
        if i >= CONFIRM_ROUNDS and _precise(session, rounds, base, winner, timed) and (
                _spanned(session, started) or not _affords_round(session, base, winner, turn, grace=False)):
            break
        a, b = session.duel(base, winner, ROUND_ROLES, first=i % 2,
                            window_s=CONFIRM_TURN_WINDOW_S, turn_s=CONFIRM_TURN_S if timed else None,
                            fresh=CONFIRM_FRESH_PARENTS and _affords_round(session, base, winner, turn, fresh=True),
                            in_turn=turn)
        ended = _ran_out(a, b)
        if ended is not None and not turn:  # once: the rounds after it run in turn
            ran_out, turn, timed = ended, True, False
            continue  # this round again, in turn
        rounds.append((a, b))
        if not (a.ok and b.ok):
            break
    return rounds, timed, ran_out, False


def _ran_out(a: ProbeResult, b: ProbeResult) -> ProbeResult | None:
    """The side of a lockstep pair whose training ended by itself (ok) while its partner, stopped with it, had not
    measured enough; None otherwise."""
    for side, partner in ((a, b), (b, a)):
        if side.ok and partner.stopped_by_partner and partner.extra["lockstep"]["partner_status"] == "ok":
            return side
    return None


def _speedup(session, rounds: list[tuple[ProbeResult, ProbeResult]], base: ProbeResult, winner: ProbeResult,
             timed: bool, notes: list[str]) -> dict[str, Any]:
    """The speedup the finished ones of `rounds` measure (`speedup_interval`), with how it was measured; a note
    where the rounds split by who went first."""
    finished = _finished(rounds)
    lockstep = all("lockstep" in r.extra for pair in finished for r in pair)
    median, low, high = speedup_interval(session, rounds, base, winner, timed)
    how = ("measured one after the other, in alternating order" if not lockstep
           else f"measured together in lockstep, in turns of about {CONFIRM_TURN_S:g} s each (one's steps take "
                f"{step_ratio(base, winner):.1f}x as long as the other's: a step a turn would read the longer steps "
                "high)" if timed else "measured together in lockstep, step by step")
    rounds_text = f"{len(finished)} round{'s' if len(finished) != 1 else ''}"
    centre_text = (f"the Hodges-Lehmann centre of the {rounds_text}' ratios (the median of their pairwise geometric "
                   "means)")
    if len(finished) >= stats.WALSH_MIN_ROUNDS:
        interval = (f"{centre_text}; 95% CI from those pairwise means (the Wilcoxon signed-rank interval), a round "
                    f"more than {stats.ROUND_CLIP:g} robust sds from the median counted at that distance (the drift "
                    "between rounds counts, a round or two read under a busy neighbour do not swing it), widened to "
                    "hold the centre and at least as wide as the CI from their steps")
    else:
        over = ("the round-to-round spread pooled over the run's repeated lockstep comparisons and" if lockstep
                and not timed else "over the rounds' spread pooled with") + (
            f" that of rounds of fresh processes on these machines (log sd {ROUND_SPREAD:g}, counted as "
            f"{ROUND_SPREAD_DF} degrees of freedom)")
        interval = (f"{centre_text}; 95% CI of their geometric mean, Student's t, {over} (below "
                    f"{stats.WALSH_MIN_ROUNDS} rounds an interval from the pairwise means is wide or none; the drift "
                    "between rounds counts), widened to hold the centre and at least as wide as the CI from their "
                    "steps")
    split = _split(rounds)
    if split is not None:
        (base_first, n_base), (rec_first, n_rec) = split
        interval += "; widened to hold the centres of both halves: the rounds split by who went first"
        notes.append(f"the confirmation's rounds split by who went first: {rec_first:.2f}x in the {n_rec} where the "
                     f"recommendation went first, {base_first:.2f}x in the {n_base} where the baseline did, none "
                     "overlapping; the speedup's interval is widened to hold both")
    return {"median": median, "ci_low": low, "ci_high": high,
            "method": f"baseline and recommended {how}, {rounds_text}", "interval": interval,
            "later": figures.later(median, low, high, session.session_drift),
            "probes": [r.id for pair in rounds for r in pair]}


def _alone(session, base: ProbeResult, winner: ProbeResult) -> list[str]:
    """Each of the two once more alone (CONFIRM_ALONE times) where the budget holds its run; their probe ids."""
    ids = []
    budget = session.budget
    for settings, role in ((winner.settings, "confirm:alone:recommended"), (base.settings, "confirm:alone:baseline")):
        for _ in range(CONFIRM_ALONE):
            left = budget.time_left(role)
            needed = plain_wall(winner if settings == winner.settings else base)
            if left is not None and left < needed:
                break
            fresh = CONFIRM_FRESH_PARENTS and (left is None or left >= needed + budget.fresh_parent_s)
            ids.append(session.run(settings, role, reuse=False, fresh=fresh).id)
    return ids


def first_mover_split(ratios: list[float | None]) -> tuple[tuple[float, int], tuple[float, int]] | None:
    """((centre, rounds) where the baseline went first, (centre, rounds) where the recommendation did), when the two
    sets of rounds do not overlap and each holds at least FIRST_MOVER_MIN_ROUNDS; else None. `ratios` in round
    order (round i: the baseline first when i is even), None for a round that did not finish."""
    halves = [[r for r in ratios[k::2] if r is not None and r > 0] for k in (0, 1)]
    if min(len(h) for h in halves) < FIRST_MOVER_MIN_ROUNDS:
        return None
    if not (max(halves[0]) < min(halves[1]) or max(halves[1]) < min(halves[0])):
        return None
    base_first, rec_first = (float(np.exp(stats.hodges_lehmann(np.log(h)))) for h in halves)
    return (base_first, len(halves[0])), (rec_first, len(halves[1]))


def step_ratio(a: ProbeResult, b: ProbeResult) -> float:
    """How far apart the two probes' median step times are (>= 1; 1 when either has no step)."""
    times = [stats.median(p.step_s) for p in (a, b)]
    if not all(t > 0 for t in times):  # NaN (no step) compares False too
        return 1.0
    return max(times) / min(times)


def reserve_s(paired: bool, fresh_parent_s: float, base: ProbeResult, best: ProbeResult,
              rounds: int = CONFIRM_MIN_ROUNDS, pair_s: float | None = None) -> float:
    """What confirming `best` against `base` takes at least: `rounds` rounds (in turn each side's window capped),
    predicted from the two probes' own wall times (a lockstep round at least `pair_s`: `_round_s`), and the
    recommended side's profile in the first. `paired`: whether the two run in lockstep (`pairing.pairs`);
    `fresh_parent_s`: the backend's."""
    turn, _ = _kind(paired, base, best)
    return rounds * _round_s(fresh_parent_s, base, best, turn, pair_s=pair_s) + _profile_s(base)


def _profile_s(base: ProbeResult) -> float:
    """What profiling the confirmation's first recommended side adds (`designate.PROFILED_ROLES`), reckoned from
    the baseline's profiled steps; 0 where it was not profiled (--no-profile). Probes' walls leave it out
    (`plain_wall`): a 1-minute hf_transformer run's first round took 13 s, 2 s of them profiling, where its reserve
    had kept 10 s a round, and its second round ran out of budget."""
    return base.extra.get("profile_wall_s") or 0.0


def rounds_to_tell(gain: float | None, untellable: int = CONFIRM_MIN_ROUNDS) -> int:
    """The rounds a confirmation of `gain` needs at least: the fewest whose Student's t interval, at ROUND_SPREAD
    pooled with the rounds' own degrees of freedom (`_pooled_spread`), clears 1 around that centre with
    CONFIRM_POWER_Z to spare, up to RESERVE_MAX_ROUNDS: one round from about 1.34x (its interval rests on
    ROUND_SPREAD alone), two from 1.21x; `untellable` (CONFIRM_MIN_ROUNDS) where not even those could (a gain
    that small is better served by the time exploring) or the gain is not known (nan, None). A 1-minute io_bound run kept 32 loader
    workers at 11.24x, held back two rounds in turn (22 s of its 60), and left persistent workers (1.9x more)
    "over budget"."""
    if gain is None or not gain > 1.0:
        return untellable
    for n in range(1, RESERVE_MAX_ROUNDS + 1):
        if (stats.t95(n - 1 + ROUND_SPREAD_DF) + CONFIRM_POWER_Z) * ROUND_SPREAD / np.sqrt(n) < np.log(gain):
            return n
    return untellable


def _kind(paired: bool, base: ProbeResult, winner: ProbeResult) -> tuple[bool, bool]:
    """(in turn, timed turns): whether the rounds run one after the other (not `paired`: a different loader, a
    backend that cannot pair, too little memory for both: see `pairing.pairs`), and whether, in lockstep, each side
    takes turns of CONFIRM_TURN_S (steps over LOCKSTEP_MAX_STEP_RATIO apart)."""
    return not paired, paired and step_ratio(base, winner) > LOCKSTEP_MAX_STEP_RATIO


def _alone_s(fresh_parent_s: float, base: ProbeResult, winner: ProbeResult, fresh: bool = False) -> float:
    """The runs alone after the rounds (CONFIRM_ALONE of each; `fresh`: each from a new zygote)."""
    return CONFIRM_ALONE * (plain_wall(base) + plain_wall(winner) + 2 * fresh_parent_s * fresh)


def _round_s(fresh_parent_s: float, base: ProbeResult, winner: ProbeResult, turn: bool, fresh: bool = False,
             pair_s: float | None = None) -> float:
    """One round's wall time: both probes', with their new zygotes' start where `fresh` (a lockstep pair's two
    start together); in turn, with each window cut to CONFIRM_TURN_WINDOW_S; in lockstep, at least `pair_s`, what
    the run's lockstep pairs took (`Budget.round_pair_s`): beside a partner each side's steps run slower and its
    turns wait, so a 1-minute hf_transformer run's lockstep rounds took 12.6 s where its two probes alone took 7.7,
    and the budget cut its second round (reckoned at their 7.7 s) 5 s in."""
    cut = [max(0.0, sum(p.step_s) - CONFIRM_TURN_WINDOW_S) if turn else 0.0 for p in (base, winner)]
    own = plain_wall(base) + plain_wall(winner) - sum(cut) + (2 if turn else 1) * fresh_parent_s * fresh
    return own if turn or pair_s is None else max(own, pair_s + fresh_parent_s * fresh)


def speedup_interval(session, rounds: list[tuple[ProbeResult, ProbeResult]], base: ProbeResult,
                     winner: ProbeResult, timed: bool) -> tuple[float, float, float]:
    """The speedup (centre, low, high) that the finished ones of `rounds` (in round order) make, as the report
    states it: the rounds' ratios (`stats.rounds_ratio_interval`: from seven rounds the Hodges-Lehmann centre's own
    interval, stray rounds clipped; below seven Student's t, over the run's pooled lockstep spread where it has more
    degrees of freedom), floored by the CI from their steps, widened to hold both halves' centres where the rounds
    split by who went first (`first_mover_split`)."""
    finished = _finished(rounds)
    ratios = [window_rate(b) / window_rate(a) for a, b in finished]
    # The floor from the steps of the rounds that read true only: pooled with a disturbed round's, it swells as
    # Student's t does (stats.stray_rounds)
    strays = stats.stray_rounds(ratios)
    _, within_low, within_high = pair_ratio([pair for pair, stray in zip(finished, strays) if not stray],
                                            waves=(base.wave, winner.wave))
    centre, low, high = stats.rounds_ratio_interval(ratios, within=(within_low, within_high),
                                                    spread=_pooled_spread(session, finished, timed))
    split = _split(rounds)
    if split is not None:
        (base_first, _), (rec_first, _) = split
        low, high = min(low, base_first, rec_first), max(high, base_first, rec_first)
    return centre, low, high


def _finished(rounds: list[tuple[ProbeResult, ProbeResult]]) -> list[tuple[ProbeResult, ProbeResult]]:
    """The rounds whose two sides both measured a window."""
    return [(a, b) for a, b in rounds if a.ok and b.ok and a.measured and b.measured]


def _split(rounds: list[tuple[ProbeResult, ProbeResult]]) -> tuple[tuple[float, int], tuple[float, int]] | None:
    """`first_mover_split` of the rounds' ratios (round i: the baseline first when i is even)."""
    finished = _finished(rounds)
    return first_mover_split([window_rate(b) / window_rate(a) if (a, b) in finished else None for a, b in rounds])


def _pooled_spread(session, rounds: list[tuple[ProbeResult, ProbeResult]], timed: bool) -> tuple[float, int]:
    """The spread (log sd, degrees of freedom) the rounds' CI uses below WALSH_MIN_ROUNDS: that of rounds of fresh
    processes (ROUND_SPREAD) pooled with the run's repeated lockstep comparisons (`compare.lockstep_drift`, these
    rounds included) for step-by-step lockstep pairs, with these rounds' own otherwise (pairs in timed turns spread
    as fresh processes do; rounds in turn share no moments)."""
    prior = (ROUND_SPREAD, ROUND_SPREAD_DF)
    if all("lockstep" in r.extra for pair in rounds for r in pair) and not timed:
        return lockstep_drift(session.ledger, prior)
    return stats.pooled_log_sd([[window_rate(b) / window_rate(a) for a, b in rounds]], prior)


def _precise(session, rounds: list[tuple[ProbeResult, ProbeResult]], base: ProbeResult, winner: ProbeResult,
             timed: bool) -> bool:
    """Whether the speedup the report would state is known to ±CONFIRM_PRECISION around its centre. The very
    interval it states (`speedup_interval`), floor and all: judged on the rounds' ratios alone, an augment_cpu
    confirmation stopped after 8 rounds in turn as precise and stated 1.66x [1.56, 1.74], -6% +5%. Rounds split by
    who went first are as precise as the interval widened to hold both halves."""
    centre, low, high = speedup_interval(session, rounds, base, winner, timed)
    return high / centre - 1 <= CONFIRM_PRECISION and 1 - low / centre <= CONFIRM_PRECISION


def _undecided(session, rounds: list[tuple[ProbeResult, ProbeResult]], base: ProbeResult, winner: ProbeResult,
               timed: bool) -> bool:
    """Whether the rounds so far read a gain worth keeping whose interval still reaches 1 (`speedup_interval`): the
    recommendation then rests on further rounds. A 1-minute raw_sensor_mlp run read the fused optimizer at 1.15x
    [0.98, 1.35] in three lockstep rounds of 3-7 s, spent its last 9 s on the runs alone, and kept the baseline."""
    if not _finished(rounds):
        return False
    centre, low, _ = speedup_interval(session, rounds, base, winner, timed)
    return promising(centre, low)


def _spanned(session, started: float) -> bool:
    """Whether the rounds since `started` (the session's clock) span CONFIRM_SPAN_SHARE of the budget; without a
    budget, the precision alone decides."""
    budget = session.budget
    return budget.limit_s is None or budget.elapsed() - started >= CONFIRM_SPAN_SHARE * budget.limit_s


def _affords_round(session, base: ProbeResult, winner: ProbeResult, turn: bool, grace: bool = True,
                   fresh: bool = False, alone: bool = True) -> bool:
    """Whether one more round and the runs alone after it (`alone` False: the round alone) fit before the
    confirmation's deadline; `grace` False: before --budget itself (rounds that only spread a precise confirmation
    over time never use the grace); `fresh`: with every probe's new zygote started."""
    budget = session.budget
    left = budget.time_left("confirm:baseline")
    if left is not None and not grace:
        left -= budget.limit_s * CONFIRM_GRACE
    parent_s = budget.fresh_parent_s
    needed = (_round_s(parent_s, base, winner, turn, fresh, budget.round_pair_s(winner))
              + (_alone_s(parent_s, base, winner, fresh) if alone else 0))
    return left is None or left >= needed


def compile_outcome(probe: ProbeResult) -> str | None:
    """What torch.compile did in a probe, coarsely enough that probes of the same settings should agree: "no graph
    (ran eagerly)", "N graphs", plus graph breaks and recompiles while measuring; None without compile."""
    stats_ = probe.extra.get("compile") if probe.ok else None
    if not stats_:
        return None
    if not stats_.get("graphs"):
        return "no graph (ran eagerly)"
    outcome = f"{stats_['graphs']} graph{'s' if stats_['graphs'] != 1 else ''}"
    if stats_.get("graph_breaks"):
        outcome += f", {stats_['graph_breaks']} graph break{'s' if stats_['graph_breaks'] != 1 else ''}"
    if stats_.get("recompiles_measured"):
        outcome += ", recompiled while measuring"
    return outcome


def compile_disagreement(probes: list[ProbeResult], confirming: list[ProbeResult],
                         settings: dict[str, Any]) -> str | None:
    """A note when torch.compile did something else in the probes the search decided on (those of `settings`
    before the confirmation) than in the confirmation's (dynamo may fall back to eager in one process and not in
    another). The confirmation's figure is then the only one the recommendation rests on."""
    confirmed = {compile_outcome(p) for p in confirming} - {None}
    if not confirmed:
        return None
    ids = {p.id for p in confirming}
    earlier = [(p.id, compile_outcome(p)) for p in probes
               if p.id not in ids and p.settings == settings and compile_outcome(p) is not None]
    other = [(pid, outcome) for pid, outcome in earlier if outcome not in confirmed]
    if not other:
        return None
    return (f"torch.compile did not do the same in every probe of these settings: {other[0][1]} in {other[0][0]}, "
            f"{' / '.join(sorted(confirmed))} in the confirmation; the recommendation rests on the confirmation's "
            "measures only")
