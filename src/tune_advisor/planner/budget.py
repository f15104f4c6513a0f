"""The wall-time budget: every rule on how long something may take, from the CLI's --budget to one probe's limits.

An analysis's budget covers everything the user waits for: inspecting the workload (`inspection_limit`), measuring
the machine's peaks (`calibration_limit`), the plan, and the rules and reports written after the last probe
(`planning_limit` keeps FINISH_RESERVE_S back for them). Within the plan, `Budget` is the clock: what is left for a
probe of a role (`time_left`, `limits`), whether more probes still fit before the ablation and the confirmation
(`affordable`), and what those will take (`confirmation_s`).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from .. import knobs
from ..collectors import flops
from ..probe.backend import ProbeBackend, ProbeLimits
from ..probe.result import ProbeResult, Status
from ..probe.spec import Protocol
from . import ablation, pairing
from .compare import DUEL_MAX_S
from .ratios import plain_wall
from .confirm import (CONFIRM_GRACE, CONFIRM_MIN_ROUNDS, CONFIRM_RESERVE, CONFIRM_TURN_WINDOW_S, RESERVE_MAX_ROUNDS,
                      ROUND_ROLES, reserve_s, rounds_to_tell)
from .keep import DUEL_ROLE
from .ledger import ProbeLedger

MIN_PROBE_S = 1.0  # a probe started at the budget's end (the confirmation) still gets this long
FINISH_RESERVE_S = 3.0  # what the rules and the reports (charts included) take after the last probe
CALIBRATION_SHARE = 0.1  # of the budget, at most, for measuring the machine's peaks (a first run per machine)
# Probes that explore only screen: they decide the clear cases and duels decide the rest, so measuring one
# longer buys little. A noisy one, on a machine whose speed swings, would otherwise run to its cap.
SCREEN_MAX_S = 3.0
SCREENING_ROLES = ("knob:", "ladder:", "bisect:")
# The baseline's window, at most, as a share of the budget left: its 15 s protocol cap was 68% of a 1-minute cnn
# run with its profiler (benchmarks/results/minute_breakdown.md), and nothing else had run by then. From a
# 2.5-minute budget the protocol's own cap decides; never below SCREEN_MAX_S.
BASELINE_SHARE = 0.1
ABLATION_START_S = 2.0  # a lockstep side's start and warm-up, beyond its measured window
# A batch the loader's workers take longer than this many of the baseline's steps to deliver (scaled to the probe's
# batch and workers: `Budget.loader_wait_s`), and at least LOADER_WAIT_MIN_S, ends the probe as hung: a dataset that
# blocked forever in its workers took 108 s of a 2-minute run as one "stopped" probe (issue 63).
LOADER_WAIT_FACTOR = 20.0
LOADER_WAIT_MIN_S = 10.0
# The thorough plan's budget, suggested where a shorter one cut the plan: where every plan the budget curve measured
# on 2-core machines ended on its own (docs/planner.md, "The default budget"). A run given that much already is
# offered twice its own.
THOROUGH_S = 10 * 60


def inspection_limit(budget_s: float | None, own_s: float, probe_timeout_s: float | None = None) -> float:
    """How long inspecting the workload may take: its own bound `own_s`, within the budget; a plain script's
    inspection runs it to its first steps, so its probe limit (`probe_timeout_s`) bounds that too."""
    limit = own_s if budget_s is None else min(own_s, budget_s)
    return limit if probe_timeout_s is None else min(limit, probe_timeout_s)


def calibration_limit(budget_s: float | None) -> float:
    """How long measuring the machine's peak FLOP/s may take: flops' own bound, or a tenth of a short budget."""
    return flops.PEAK_TIMEOUT_S if budget_s is None else max(0.5, min(flops.PEAK_TIMEOUT_S,
                                                                      CALIBRATION_SHARE * budget_s))


def planning_limit(budget_s: float | None) -> float | None:
    """The plan's share of the budget: it ends where the rules and the reports still fit (None: no budget)."""
    return None if budget_s is None else max(0.0, budget_s - FINISH_RESERVE_S)


def role_cap(role: str) -> float | None:
    """The most a probe of `role` measures whatever its protocol says: screening probes SCREEN_MAX_S, a duel's
    sides DUEL_MAX_S, a confirmation round's sides CONFIRM_TURN_WINDOW_S, in lockstep too (the runs alone: the
    protocol's own); None: the protocol's own. A 1-minute varlen_transformer run's first confirmation round, in
    timed turns, measured 26 turns a side (13 s) where its steps stayed noisy, and the budget stopped it at 25.7 s:
    no round finished, and the baseline stayed; its reserve had reckoned a round from the probes' 3 s walls."""
    if role.startswith(SCREENING_ROLES):
        return SCREEN_MAX_S
    if role == DUEL_ROLE or role.startswith(ablation.ROLE):
        return DUEL_MAX_S
    if role in ROUND_ROLES:
        return CONFIRM_TURN_WINDOW_S
    return None


def probe_limits(role: str, left_s: float | None) -> ProbeLimits:
    """A probe's limits: `role_cap`, the baseline's BASELINE_SHARE, and a measurement that stops extending in time
    to leave a result within `left_s` (what is left of the budget for it)."""
    share = None if left_s is None or role != "baseline" else max(SCREEN_MAX_S, BASELINE_SHARE * left_s)
    caps = [c for c in (role_cap(role), share, None if left_s is None else left_s / 2) if c is not None]
    return ProbeLimits(left_s, min(caps) if caps else None)


def protocol_for(role: str, protocol: Protocol, left_s: float | None) -> Protocol:
    """The measurement protocol of a probe of `role` with `left_s` of the budget left (`probe_limits`)."""
    return probe_limits(role, left_s).protocol(protocol)


class Budget:
    """The plan's clock and its time rules. `limit_s`: the plan's share of the budget (None: no limit);
    `started`: when the budget began (clock time; it includes the work done before planning). A resumed run adds
    the interrupted run's time (`ledger.carried_s`), and while the ledger replays it the clock stands where the
    interrupted run's was (`ledger.replay_at`). What the plan's end costs is reckoned from the ledger's baseline and
    best, the probes' wall times and whether `backend` pairs them."""

    def __init__(self, limit_s: float | None, ledger: ProbeLedger, backend: ProbeBackend,
                 clock: Callable[[], float] = time.monotonic, started: float | None = None):
        self.limit_s, self.ledger, self.backend, self.clock = limit_s, ledger, backend, clock
        self.started = clock() if started is None else started

    def elapsed(self) -> float:
        if self.ledger.replaying:
            return self.ledger.replay_at
        return self.ledger.carried_s + self.clock() - self.started

    @property
    def fresh_parent_s(self) -> float:
        """What a probe forked from a new parent (`fresh=True`) costs beyond others: `backend.fresh_parent_s`."""
        return self.backend.fresh_parent_s

    def typical_probe_s(self) -> float:
        """What the next probe will likely take: the mean so far, which long probes (many loader workers running
        to the time cap) pull up, unlike the median."""
        walls = [plain_wall(p) for p in self.ledger.probes if p.wall_s > 0]
        return sum(walls) / len(walls) if walls else 0.0

    def pair_s(self) -> float:
        """What the next lockstep pair will likely take: `measured_pair_s`, else two typical probes. Pairs take
        longer than two probes alone: on a 2-core machine hf_trainer's took 8-12 s where its probes alone took
        3.5-4 s, and a 1-minute run, reckoning a pair at two of those, started one with 8 s left for exploring; the
        budget stopped both sides."""
        measured = self.measured_pair_s()
        return measured if measured is not None else 2 * self.typical_probe_s()

    def round_pair_s(self, best: ProbeResult) -> float | None:
        """What a lockstep confirmation round of `best` will likely take: the run's pairs beside it, else all its
        pairs (`measured_pair_s`); compiled sides start and warm up longer than the rest."""
        beside = self.measured_pair_s(best.settings)
        return beside if beside is not None else self.measured_pair_s()

    def measured_pair_s(self, beside: dict[str, Any] | None = None) -> float | None:
        """The mean of the run's lockstep pairs so far, each both sides' own time (their turns, starts and
        warm-ups; not their waits for each other), but those cut short (`Status.STOPPED`); `beside`: only pairs
        with a side of these settings. None before any."""
        sides: dict[frozenset, float] = {}
        cut, chosen = set(), set()
        for p in self.ledger.probes:
            partner = (p.extra.get("lockstep") or {}).get("partner")
            if partner and p.wall_s > 0:
                pair = frozenset((p.id, partner))
                sides[pair] = sides.get(pair, 0.0) + plain_wall(p)
                if p.status == Status.STOPPED:
                    cut.add(pair)
                if beside is None or p.settings == beside:
                    chosen.add(pair)
        whole = [s for pair, s in sides.items() if pair not in cut and pair in chosen]
        return sum(whole) / len(whole) if whole else None

    def affordable(self, probes: int = 1, extra_s: float = 0.0, within: float = 1.0,
                   confirming: bool = False, yielding: bool = False) -> bool:
        """Whether `probes` more (costing `extra_s` beyond typical probes: compilation), and then the
        confirmation, fit in what is left of the budget (of its first `within` share, for work the plan does only
        while the budget is ample). `confirming`: count a confirmation even while nothing is to confirm yet (the
        probes asked about would make one: a ladder's rungs that win). `yielding`: work that yields to the
        confirmation of a kept gain too small for CONFIRM_MIN_ROUNDS to tell, counting the rounds that could, up to
        RESERVE_MAX_ROUNDS (a second look: one 1-minute varlen_transformer run spent 25 s on four more duels of
        the fused optimizer at 1.03x beside its kept batch 64, whose confirmation then read 1.10x [1.00, 1.23] in
        the three rounds left and kept the baseline; its run before confirmed batch 64 in four)."""
        if self.limit_s is None:
            return True
        confirmation = self.confirmation_s(untellable=RESERVE_MAX_ROUNDS if yielding else CONFIRM_MIN_ROUNDS)
        if confirming:
            confirmation = max(confirmation, CONFIRM_RESERVE * self.typical_probe_s())
        needed = probes * self.typical_probe_s() + extra_s + confirmation
        return self.elapsed() + needed <= self.limit_s * within

    def affords_ablation(self, left: int) -> bool:
        """Whether the next ablation pair, the `left - 1` after it and the confirmation fit in the budget."""
        return self.limit_s is None or self.elapsed() + self.confirmation_s(left) <= self.limit_s

    def time_left(self, role: str) -> float | None:
        """How long a probe of `role` may still run before the budget ends (None: no budget). The runner kills it
        there: a probe that overruns its prediction (a noisy measurement running to its cap, dozens of loader
        workers starting) must not take the budget with it. Exploring probes leave the confirmation its time."""
        if self.limit_s is None:
            return None
        if role.startswith("confirm"):
            return self.limit_s * (1 + CONFIRM_GRACE) - self.elapsed()
        return self.limit_s - self.confirmation_s() - self.elapsed()  # an ablation pair was afforded likewise

    def limits(self, role: str) -> ProbeLimits:
        """A probe's limits now (`probe_limits`): what is left for it, at least MIN_PROBE_S."""
        left = self.time_left(role)
        return probe_limits(role, None if left is None else max(left, MIN_PROBE_S))

    def confirmation_s(self, ablations: int = 0, untellable: int = CONFIRM_MIN_ROUNDS) -> float:
        """What the end of the plan will take: `ablations` ablation pairs and the confirmation's least rounds of
        the baseline against the current best, those that could tell the gain the search kept it on from noise
        (`confirm.reserve_s`, `confirm.rounds_to_tell`; further rounds and the runs alone only where
        time is left then). Exploring keeps back the confirmation alone: the ablation measures what time is left
        after it, and where none is, the search's own measures of each knob decide (planner/ablation.py); a
        1-minute cnn run held back three ablation pairs (17 s) while amp, channels_last and a batch ladder waited.
        `untellable`: the rounds kept back for a gain too small for RESERVE_MAX_ROUNDS to tell."""
        base = self.ledger.baseline
        if base is None:
            return CONFIRM_RESERVE * self.typical_probe_s()
        best = self.ledger.best if self.ledger.best is not None or self.ledger.keeps_as_it_goes else \
            self._fastest_over(base)
        if best is None:  # nothing to confirm yet: the time goes to exploring (issue 63: 1-minute runs ended with
            # knobs "over budget" and a third of the budget held back for a confirmation never run; one
            # hf_transformer run read batch 32 at 1.00x of the baseline, kept neither, and held two rounds of
            # batch 32 against it, 44 s, back: it ended at 23 s of 60 with compile and the fused optimizer cut)
            return 0.0
        confirming = reserve_s(pairing.pairs(self.backend, base, best, pairing.computes_loading(base)),
                               self.fresh_parent_s, base, best,
                               rounds_to_tell(self.ledger.kept_gain(best), untellable), self.round_pair_s(best))
        return confirming + self.ablation_pair_s() * ablations

    def loader_wait_s(self, settings: dict[str, Any]) -> float | None:
        """How long the training loader may take to deliver a batch of a probe with `settings` (ProbeSpec.
        loader_wait_s): LOADER_WAIT_FACTOR of the baseline's median step, times the probe's batch over the
        baseline's (each worker makes whole batches) and its workers over the cores (the first batches share
        them), at least LOADER_WAIT_MIN_S; None before a baseline has measured."""
        base = self.ledger.baseline
        if base is None or not base.ok or not base.measured:
            return None
        batch = (settings.get("batch_size") or 1) / (base.settings.get("batch_size") or 1)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        scale = max(1.0, batch) * max(1.0, (settings.get("num_workers") or 0) / cores)
        return max(LOADER_WAIT_MIN_S, LOADER_WAIT_FACTOR * statistics.median(base.step_s) * scale)

    def _fastest_over(self, base: ProbeResult) -> ProbeResult | None:
        """The fastest probe that measured faster than the baseline `base` (a candidate a strategy has not kept yet:
        the grid keeps none until its end); None while none did: then there is nothing to confirm."""
        faster = [p for p in self.ledger.probes if p.ok and p.settings != base.settings
                  and p.throughput_median > base.throughput_median]
        return max(faster, key=lambda p: p.throughput_median, default=None)

    def ablation_pair_s(self) -> float:
        """One ablation pair: each side measures at most DUEL_MAX_S beyond its start-up, and takes at least what
        the run's pairs beside the best took (`measured_pair_s`): its sides start and warm up as the best's did. A
        2-minute hf_transformer run reckoned an ablation pair of its compiled best at 12 s where its pair beside
        the best had taken 26 s of both sides' time, started one, and the budget stopped it 22.5 s in."""
        best = self.ledger.best if self.ledger.best is not None else self.ledger.baseline
        if best is None:
            return 0.0
        return max(2 * min(plain_wall(best), DUEL_MAX_S + ABLATION_START_S), self.measured_pair_s(best.settings) or 0.0)


@dataclass(frozen=True)
class MoreTime:
    """What the budget cut from a plan: the settings it left for want of time, each once, in the plan's order
    (`cut`); those of them no probe measured (`untried`: what more time would have tried); the budget to run the
    thorough plan with (`budget_s`)."""

    cut: list[str]
    untried: list[str]
    budget_s: float

    @property
    def budget(self) -> str:
        """`budget_s` as --budget takes it: whole minutes, rounded up ("10m")."""
        return f"{math.ceil(self.budget_s / 60)}m"

    @property
    def knobs(self) -> set[str]:
        """The knobs `untried` names: more time would have tried them, so they apply here."""
        return {knob for what in self.untried for knob, _ in _parts(what)}


def more_time(unexplored: Iterable[str], limit_s: float | None, measured: Iterable[Mapping[str, Any]] = (),
              baseline: Mapping[str, Any] | None = None) -> MoreTime | None:
    """What more time would have tried where the budget cut the plan; None where the plan ended on its own.

    `unexplored`: results.json `budget.unexplored`, "SETTINGS: WHY" each, of which only the budget's cuts count
    ("over budget", "stopped when the budget ran out"), not the plan's reasoned skips; `limit_s`: the run's --budget.
    `measured` (the settings of the run's ok probes) and `baseline` (its baseline's settings) tell which cut
    settings a probe measured all the same (a re-opened ladder's rung over budget that its first visit measured):
    more time would not be trying those for the first time."""
    cut = list(dict.fromkeys(what for what, _, why in (entry.partition(": ") for entry in unexplored)
                             if "over budget" in why or "budget ran out" in why))
    if not cut:
        return None
    measured = list(measured)
    base = knobs.full_settings(baseline or {})
    untried = [what for what in cut if not any(_holds(settings, what, base) for settings in measured)]
    limit = limit_s or 0.0
    return MoreTime(cut, untried, THOROUGH_S if limit < THOROUGH_S else 2 * limit)


def _holds(settings: Mapping[str, Any], what: str, base: Mapping[str, Any]) -> bool:
    """Whether `settings` hold every part of `what`: each "knob=value" as knobs.describe words it, each bare knob at
    any value but the baseline's (`base`)."""
    parts = _parts(what)
    return bool(parts) and all(knob in settings and (knobs.describe({knob: settings[knob]}) == part if part
                                                     else settings[knob] != base.get(knob)) for knob, part in parts)


def _parts(what: str) -> list[tuple[str, str]]:
    """Settings as an unexplored entry names them ("amp=bf16, batch_size=64", or a bare knob) as (knob, "knob=value"
    or "" for a bare knob); [] where a part names no knob ("batch_size between 64 and 128")."""
    parts = [(part.partition("=")[0], part if "=" in part else "") for part in what.split(", ")]
    return parts if all(knob in knobs.KNOBS for knob, _ in parts) else []
