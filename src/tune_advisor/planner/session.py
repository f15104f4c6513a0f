"""The probe session: what a planner asks to have measured. It has probes run by a ProbeBackend (probe/backend.py),
records them in its ProbeLedger (planner/ledger.py: numbering, reuse, resume replay, samples), keeps to its Budget
(planner/budget.py: every time rule), and measures a comparison again while the evidence cannot decide it
(`beats`; the comparisons themselves are functions of the ledger: planner/compare.py).

Planners talk to the world only through the Session, so tests drive them with a fake backend in milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

from ..probe.backend import ProbeBackend, ProbeLimits, SpecMaker, bare_spec
from ..probe.result import ProbeResult, Status
from ..probe.spec import ProbeSpec
from . import compare, pairing
from .budget import Budget
from .compare import CLEAR_GAIN, DUEL_FROM, MAX_DUELS, MAX_DUELS_AMPLE, MAX_DUELS_SECOND_LOOK, MIN_DUELS_UNDECIDED
from .ratios import plain_wall
from .keep import DUEL_ROLE, MIN_GAIN
from .ledger import ProbeLedger

Settings = dict[str, Any]


class Session:
    """Runs probes through `backend` into its `ledger`, within its `budget`.

    `make_spec` turns (probe id, settings, role, the budget's limits for it) into the spec the backend runs
    (analyze's carries the workload, device and protocol; the default only id, settings and time left).
    `budget_s`: the plan's share of the budget (None: no limit); `started`: when the budget began, so that it
    includes work done before planning (inspecting the workload); `finished`: an interrupted run's probes, replayed
    (ProbeLedger); `session_drift`: the figures' drift between sessions (None: figures.SESSION_DRIFT).
    """

    def __init__(self, backend: ProbeBackend, budget_s: float | None = None,
                 on_probe: Callable[[ProbeResult], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 started: float | None = None, finished: list[tuple[ProbeResult, float]] | None = None,
                 make_spec: SpecMaker = bare_spec, session_drift: float | None = None):
        self.backend, self.make_spec, self.session_drift = backend, make_spec, session_drift
        self.ledger = ProbeLedger(finished, on_probe)
        self.budget = Budget(budget_s, self.ledger, backend, clock, started)

    def run(self, settings: Settings, role: str, reuse: bool = True, window_s: float | None = None,
            fresh: bool = False) -> ProbeResult:
        """A probe of `settings` (the earlier one of the same settings where `reuse`), measuring at most
        `window_s` where given; `fresh`: forked from a new parent (`ProbeSpec.fresh_parent`)."""
        ledger = self.ledger
        seen = ledger.seen(settings)
        if reuse and seen is not None:
            return seen
        result = ledger.replayed(settings, role) or self.backend.run(
            self._spec(ledger.next_id(), settings, role, window_s, fresh=fresh), role)
        ledger.record(result, role)
        ledger.remember(result)
        return result

    def measure(self, settings: Settings, role: str, against: ProbeResult) -> ProbeResult:
        """A setting to be judged against `against` (the current best): measured beside it in one lockstep pair
        where the two can be paired, so the judgement rests on moments both saw; a screen alone otherwise (a
        loader change, a backend that cannot pair, or too little memory for both). One pair replaces a screen followed
        by a duel: separate screens run in moments of the machine up to 2x apart (one tiny_batch_mlp screen of
        batch 128 read 0.50x of 64, ending its ladder; one lstm_collate screen of batch 32 read 1,089
        sequences/s where its duels read 650-750, and 64 looked 0.80x of it). A screen alone too where the budget
        holds one probe but not a pair (its two sides take turns: two probes' time): a 1-minute augment_cpu run
        started a pair with 6 s left for exploring, and the budget stopped both sides."""
        seen = self.ledger.seen(settings)
        if seen is not None:
            return seen
        if not self._can_pair(against, settings):
            return self._in_turn(against, settings, self.run(settings, role))
        if not self.budget.affordable(0, extra_s=self.budget.pair_s()):
            result = self.run(settings, role)
            result.extra["in_turn"] = "measured alone: the budget left the time of one probe, not of a lockstep pair"
            return result
        _, result = self.duel(against, settings, (DUEL_ROLE, role))
        if result.status is Status.OOM or (result.status is Status.STOPPED and not result.extra.get("budget_stopped")):
            # the pair held two probes' memory: out of memory beside its reference is not out of memory alone; and
            # a side stopped because its partner failed has no verdict of its own yet
            result = self.ledger.remember(self.run(settings, role, reuse=False), replace=True)
        return result

    def pairs(self, reference: ProbeResult, candidate: ProbeResult) -> bool:
        """Whether a duel of these two probes' settings would run in lockstep (`pairing.pairs`)."""
        return pairing.pairs(self.backend, reference, candidate, self._loading_computes())

    def _can_pair(self, reference: ProbeResult, settings: Settings) -> bool:
        """Whether `settings`, not necessarily measured yet, would run in lockstep beside `reference`, with its
        peak memory estimated where it was not measured (`pairing.estimated_peak`)."""
        peak = pairing.estimated_peak(self.ledger.seen(settings), self.ledger.probes, settings, reference)
        return pairing.can_pair(self.backend, reference, settings, peak, self._loading_computes())

    def _loading_computes(self) -> bool:
        """Whether this workload's loading is CPU work (`pairing.computes_loading` of the plan's baseline)."""
        return pairing.computes_loading(self.ledger.baseline)

    def duel(self, reference: ProbeResult, candidate: ProbeResult | Settings,
             roles: tuple[str, str] = (DUEL_ROLE, DUEL_ROLE), first: int = 0,
             window_s: float | None = None, turn_s: float | None = None,
             fresh: bool = False, in_turn: bool = False) -> tuple[ProbeResult, ProbeResult]:
        """Measure both settings again (`candidate`: a probe, or settings not yet measured), together in
        lockstep, step by step (`backend.pair`: probe/lockstep.py), so both see the same moments of the
        machine, each side's turns lasting about `turn_s` where given; one after the other where the backend
        cannot pair them (`pairing`), each then measuring at most `window_s` where given. `first` is the side
        that moves (or runs) first; `fresh`: each side forked from a new parent (ProbeSpec.fresh_parent);
        `in_turn`: one after the other even where they could pair. Returns the new (reference, candidate) results."""
        if isinstance(candidate, ProbeResult):
            paired = self.pairs(reference, candidate)
            candidate = candidate.settings
        else:
            paired = self._can_pair(reference, candidate)
        sides = (reference.settings, candidate)
        if paired and not in_turn:
            a, b = self._in_lockstep(sides, roles, first, turn_s, fresh)
        else:  # in turn, each recorded as it finishes (a resumed run replays them in this order)
            done = {i: self.run(sides[i], roles[i], reuse=False, window_s=window_s, fresh=fresh)
                    for i in ((0, 1) if first == 0 else (1, 0))}
            a, b = self._in_turn(reference, candidate, done[0]), self._in_turn(reference, candidate, done[1])
        self.ledger.note_duel(*sides, (a, b))
        return a, b

    def _in_turn(self, reference: ProbeResult, settings: Settings, result: ProbeResult) -> ProbeResult:
        """`result`, measured one after the other with `reference`, with why where the two could otherwise have
        shared a lockstep pair (`extra.in_turn`: pairing.in_turn_why), so the report says how they were compared."""
        why = pairing.in_turn_why(self.backend, reference, settings, self._loading_computes())
        if why is not None:
            result.extra["in_turn"] = why
        return result

    def _in_lockstep(self, sides: tuple[Settings, Settings], roles: tuple[str, str], first: int,
                     turn_s: float | None, fresh: bool) -> tuple[ProbeResult, ProbeResult]:
        """A lockstep pair of `sides` (replayed where a resumed run measured it), both recorded."""
        ledger = self.ledger
        a = ledger.replayed(sides[0], roles[0])
        b = ledger.replayed(sides[1], roles[1]) if a is not None else None
        if a is not None and b is None:  # the replay ended between the two: keep that probe, run the pair anew
            ledger.record(a)
        if b is None:
            limits = self.budget.limits(roles[0])  # one protocol and one limit for both: the pair ends as one
            specs = [self._spec(ledger.next_id(i), settings, role, turn_s=turn_s, fresh=fresh, limits=limits)
                     for i, (settings, role) in enumerate(zip(sides, roles))]
            a, b = self.backend.pair(specs, list(roles), first)
        for result, role in ((a, roles[0]), (b, roles[1])):
            ledger.record(result, role)
            ledger.remember(result)
        return a, b

    def run_many(self, settings_list: list[Settings], role: str) -> list[ProbeResult]:
        """Independent probes together where the backend runs several side by side (`backend.width` from 2:
        --executor ray), each recorded as it finishes; one after another otherwise, and while replaying a resumed
        run."""
        ledger = self.ledger
        fresh = [s for s in settings_list if ledger.seen(s) is None]
        if self.backend.width < 2 or ledger.replaying or len(fresh) < 2:
            return [self.run(s, role) for s in settings_list]
        jobs = [(self._spec(ledger.next_id(i), s, role), role) for i, s in enumerate(fresh)]
        for result in self.backend.many(jobs):
            ledger.record(result, role)
            ledger.remember(result)
        return [ledger.seen(s) for s in settings_list]

    def skip(self, settings: Settings, role: str, reason: str) -> ProbeResult:
        """Record a probe that was not run (not applicable), so the report says why."""
        ledger = self.ledger
        seen = ledger.seen(settings)
        if seen is not None:
            return seen
        result = ledger.replayed(settings, role) or ProbeResult(
            id=ledger.next_id(), settings=dict(settings), status=Status.SKIPPED, error=reason, role=role)
        ledger.record(result)
        return ledger.remember(result)

    def beats(self, reference: ProbeResult, candidate: ProbeResult, duel_from: float = DUEL_FROM,
              second_look: bool = False) -> bool:
        """A gain larger than the noise: at least MIN_GAIN, and the ratio's 95% CI excludes 1.

        Separate probes decide only the clear cases (a ratio under `duel_from`, or from CLEAR_GAIN), and not where
        the machine disturbed one of them (`compare.disturbed`). Between
        them both are measured again in a duel, together in lockstep where they can be; a comparison whose CI
        cannot yet tell a loss from a gain has at least MIN_DUELS_UNDECIDED, and a gain still promising but
        inconclusive after them (loader-bound probes are bursty) earns another, up to MAX_DUELS, while the budget
        allows (a gain over the baseline up to MAX_DUELS_AMPLE while the budget is ample, as do rounds in turn that
        would tell their gain within those, `compare.tellable_in_turn`, and so does a
        `second_look`: the plan's last open comparison, planner/adaptive.py, which goes on while still promising,
        up to MAX_DUELS_SECOND_LOOK). Without the budget for one, the evidence so far decides."""
        ledger = self.ledger
        median, low, high = compare.gain(ledger, reference, candidate)
        unknown = median != median  # failed, or no measures of one kind (alone / paired) on both sides
        # screens the machine disturbed decide nothing alone, a loss or a clear gain
        screens_decide = not (compare.disturbed(reference, candidate)
                              and not compare.dueled(ledger, reference, candidate))
        if (unknown and not (reference.ok and candidate.ok)) or (screens_decide and (median < duel_from or (
                median >= CLEAR_GAIN and low >= 1 + MIN_GAIN))):
            return self._decided(reference, candidate)
        while (asked := compare.asked(ledger, reference, candidate)) < (
                MAX_DUELS_SECOND_LOOK if second_look else MAX_DUELS_AMPLE):
            dueled = compare.dueled(ledger, reference, candidate)
            untold = compare.untold(low, high) and (asked < MIN_DUELS_UNDECIDED or
                                                    (second_look and asked < MAX_DUELS_AMPLE))
            if dueled and not (compare.promising(median, low) or untold):
                break  # decided
            if asked >= MAX_DUELS and not (second_look or ledger.is_baseline(reference) or compare.tellable_in_turn(
                    ledger, reference, candidate, MAX_DUELS_AMPLE)):
                break  # past MAX_DUELS: gains over the baseline, a plan's second look, rounds in turn near telling
            again_s = max(0.0, plain_wall(reference) + plain_wall(candidate) - 2 * self.budget.typical_probe_s())
            # past MAX_DUELS: in the budget's first half only, but for a second look (nothing else is left to spend
            # the budget on but the confirmation, whose reserve `affordable` keeps)
            within = 1.0 if asked < MAX_DUELS or second_look else 0.5
            # a second look yields to the rounds a small kept gain's confirmation needs (Budget.affordable)
            if not self.budget.affordable(2, extra_s=again_s, within=within, yielding=second_look):
                break
            a, b = self.duel(reference, candidate, first=sum(map(len, ledger.duels.values())) % 2)  # alternate
            if not (a.ok and b.ok):
                break
            median, low, high = compare.gain(ledger, reference, candidate)
        return self._decided(reference, candidate)

    def _decided(self, reference: ProbeResult, candidate: ProbeResult) -> bool:
        """Whether the evidence so far shows a gain beyond the noise (`compare.clears`); a gain shown in lockstep
        goes into the ledger as a link for `compare.chained_gain`. (Not a clear gain of separate probes: each
        carries its moment of the machine, and a product of such ratios compounds them; docs/planner.md has an
        example.)"""
        gain = compare.gain(self.ledger, reference, candidate)
        won = compare.clears(gain)
        if won and compare.lockstep(self.ledger, reference, candidate):
            self.ledger.note_win(reference, candidate, gain)
        return won

    def _spec(self, probe_id: str, settings: Settings, role: str, window_s: float | None = None,
              turn_s: float | None = None, fresh: bool = False, limits: ProbeLimits | None = None) -> ProbeSpec:
        """The backend's spec for a probe, within `limits` (default: the budget's for its role now); `window_s`
        caps how long it measures, `turn_s` sets a lockstep side's turns (Protocol.turn_s), `fresh` forks it from
        a new parent (ProbeSpec.fresh_parent)."""
        spec = self.make_spec(probe_id, dict(settings), role, limits or self.budget.limits(role))
        spec = replace(spec, loader_wait_s=self.budget.loader_wait_s(settings))
        if fresh:
            spec = replace(spec, fresh_parent=True)
        proto = spec.protocol
        if turn_s is not None:
            proto = replace(proto, turn_s=turn_s)
        if window_s is not None and proto.max_time_s > window_s:
            proto = replace(proto, max_time_s=max(proto.min_time_s, window_s))
        return spec if proto == spec.protocol else replace(spec, protocol=proto)
