"""The probe session: runs probes through `runner`, numbers them, reuses identical settings, replays a resumed
run, keeps the wall-time budget, and holds every measure for the comparisons (planner/compare.py) and the
figures a report prints.

Planners talk to the world only through the Session, which has probes run by a ProbeBackend (probe/backend.py),
so tests drive them with a fake backend in milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

from .. import knobs
from ..collectors import cuda_memory
from ..probe.backend import ProbeBackend, SpecMaker, bare_spec
from ..probe.result import ProbeResult, Status
from ..probe.spec import ProbeSpec, Protocol
from . import ablation, figures
from .compare import DUEL_MAX_S, Comparisons, plain_wall, settings_key
from .confirm import CONFIRM_GRACE, CONFIRM_RESERVE, reserve_s
from .keep import DUEL_ROLE, together, without

# Probes that explore only screen: they decide the clear cases and duels decide the rest, so measuring one
# longer buys little. A noisy one, on a machine whose speed swings, would otherwise run to its cap.
SCREEN_MAX_S = 3.0
SCREENING_ROLES = ("knob:", "ladder:", "bisect:")
ABLATION_START_S = 2.0  # a lockstep side's start and warm-up, beyond its measured window

class Unexplored(list):
    """What the plan left unexplored, each entry once: a re-opened ladder stops at the same plateau again."""

    def append(self, entry: str) -> None:
        if entry not in self:
            super().append(entry)

    def extend(self, entries) -> None:
        for entry in entries:
            self.append(entry)


class Session(Comparisons):
    """Runs probes through `backend`, numbers them, reuses identical settings, and keeps the wall-time budget.

    `make_spec` turns (probe id, settings, role, seconds of the budget left for it) into the spec the backend runs
    (analyze's carries the workload, device and protocol; the default only id, settings and time left).
    `started` lets the budget include work done before planning (inspecting the workload).

    `finished` resumes an interrupted run: its probes as (result, session elapsed seconds when it was recorded),
    in run order. The planner is deterministic given its probe results, so it asks for the same probes again, and
    each is handed back instead of run ("replayed"), with the clock standing at the time it was recorded then, so
    budget decisions come out as they did. The first request that differs (e.g. a smaller budget now) ends the
    replay: the rest are `discarded` and the plan goes on live. Afterwards the budget counts the interrupted
    run's time up to its last finished probe plus this run's own.
    """

    def __init__(self, backend: ProbeBackend, budget_s: float | None = None,
                 on_probe: Callable[[ProbeResult], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 started: float | None = None, finished: list[tuple[ProbeResult, float]] | None = None,
                 make_spec: SpecMaker = bare_spec, session_drift: float | None = None):
        self.backend, self.make_spec = backend, make_spec
        self.session_drift = session_drift  # the figures' drift between sessions (None: figures.SESSION_DRIFT)
        self.budget_s, self.on_probe, self.clock = budget_s, on_probe, clock
        self.started = clock() if started is None else started
        self._replay = list(finished or [])
        self._carried = self._replay[-1][1] if self._replay else 0.0  # the interrupted run's time
        first = self._replay[0] if self._replay else None
        self._replay_clock = max(0.0, first[1] - first[0].wall_s) if first else 0.0
        self.reused: list[ProbeResult] = []
        self.discarded: list[ProbeResult] = []
        self.probes: list[ProbeResult] = []
        self.unexplored: list[str] = Unexplored()
        self._by_settings: dict[tuple, ProbeResult] = {}
        self._duels: dict[tuple, list[tuple[ProbeResult, ProbeResult]]] = {}  # (reference, candidate) keys
        # candidate key -> (reference key, gain) of each change kept in a lockstep duel (see chained_gain)
        self._lockstep_wins: dict[tuple, tuple[tuple, tuple[float, float, float]]] = {}
        self.keeps: dict[str, dict[str, Any]] = {}  # knob -> the search's keep of it (Comparisons.note_keep)
        self.baseline: ProbeResult | None = None  # set by the planner; the confirmation's cost is estimated from
        self.best: ProbeResult | None = None  # these two

    def elapsed(self) -> float:
        if self._replay:
            return self._replay_clock
        return self._carried + self.clock() - self.started

    @property
    def replaying(self) -> bool:
        """Whether finished probes of the interrupted run are still waiting to be asked for again."""
        return bool(self._replay)

    def end_replay(self) -> None:
        """The plan is over: finished probes it did not ask for again are discarded."""
        self.discarded += [result for result, _ in self._replay]
        self._replay = []

    def _replayed(self, settings: dict[str, Any], role: str) -> ProbeResult | None:
        """The next finished probe if it is the one now asked for; else the replay ends here."""
        if not self._replay:
            return None
        result, elapsed = self._replay[0]
        if result.settings != settings or result.role != role:
            self.end_replay()
            return None
        self._replay.pop(0)
        self._replay_clock = elapsed
        self.reused.append(result)
        return result

    def typical_probe_s(self) -> float:
        """What the next probe will likely take: the mean so far, which long probes (many loader workers running
        to the time cap) pull up, unlike the median."""
        walls = [plain_wall(p) for p in self.probes if p.wall_s > 0]
        return sum(walls) / len(walls) if walls else 0.0

    def is_baseline(self, probe: ProbeResult) -> bool:
        """Whether `probe` measured the baseline's settings (the plan's start)."""
        return self.baseline is not None and probe.settings == self.baseline.settings

    def affordable(self, probes: int = 1, extra_s: float = 0.0, within: float = 1.0) -> bool:
        """Whether `probes` more (costing `extra_s` beyond typical probes: compilation), and then the
        confirmation, fit in what is left of the budget (of its first `within` share, for work the plan does only
        while the budget is ample)."""
        if self.budget_s is None:
            return True
        needed = probes * self.typical_probe_s() + extra_s + self.confirmation_s()
        return self.elapsed() + needed <= self.budget_s * within

    @property
    def fresh_parent_s(self) -> float:
        """What a probe forked from a new parent (`fresh=True`) costs beyond others: `backend.fresh_parent_s`."""
        return self.backend.fresh_parent_s

    def time_left(self, role: str) -> float | None:
        """How long a probe of `role` may still run before the budget ends (None: no budget). The runner kills it
        there: a probe that overruns its prediction (a noisy measurement running to its cap, dozens of loader
        workers starting) must not take the budget with it. Exploring probes leave the confirmation its time."""
        if self.budget_s is None:
            return None
        if role.startswith("confirm"):
            return self.budget_s * (1 + CONFIRM_GRACE) - self.elapsed()
        if role.startswith(ablation.ROLE):  # its pair was afforded with the confirmation after it
            return self.budget_s - self.confirmation_s(ablations=0) - self.elapsed()
        return self.budget_s - self.confirmation_s() - self.elapsed()

    def confirmation_s(self, ablations: int | None = None) -> float:
        """What the end of the plan will take: the ablation's pairs (`ablations` of them; default one per knob
        the current best changes) and the confirmation's least rounds of the baseline against the current best,
        and their runs alone (`confirm.reserve_s`; a further round only where time is left then)."""
        if self.baseline is None:
            return CONFIRM_RESERVE * self.typical_probe_s()
        best = self.best if self.best is not None else self.baseline
        confirming = reserve_s(self, self.baseline, best)
        if ablations is None:
            ablations = len(ablation.ablatable(self.baseline.settings, best.settings))
        return confirming + self.ablation_pair_s() * ablations

    def ablation_pair_s(self) -> float:
        """One ablation pair: each side measures at most DUEL_MAX_S beyond its start-up."""
        best = self.best if self.best is not None else self.baseline
        return 2 * min(plain_wall(best), DUEL_MAX_S + ABLATION_START_S) if best is not None else 0.0

    def affords_ablation(self, left: int) -> bool:
        """Whether the next ablation pair, the `left - 1` after it and the confirmation fit in the budget."""
        return self.budget_s is None or self.elapsed() + self.confirmation_s(left) <= self.budget_s

    def seen(self, settings: dict[str, Any]) -> ProbeResult | None:
        return self._by_settings.get(settings_key(settings))

    def run(self, settings: dict[str, Any], role: str, reuse: bool = True,
            window_s: float | None = None, fresh: bool = False) -> ProbeResult:
        """A probe of `settings` (the earlier one of the same settings where `reuse`), measuring at most
        `window_s` where given; `fresh`: forked from a new parent (`ProbeSpec.fresh_parent`)."""
        key = settings_key(settings)
        if reuse and key in self._by_settings:
            return self._by_settings[key]
        result = self._replayed(settings, role) or self.backend.run(
            self._spec(f"p{len(self.probes) + 1:03d}", settings, role, window_s, fresh=fresh), role)
        result.role = result.role or role
        self._record(result)
        self._by_settings.setdefault(key, result)
        return result

    def measure(self, settings: dict[str, Any], role: str, against: ProbeResult) -> ProbeResult:
        """A setting to be judged against `against` (the current best): measured beside it in one lockstep pair
        where the two can be paired, so the judgement rests on moments both saw; a screen alone otherwise (a
        loader change, a backend that cannot pair, or too little memory for both). One pair replaces a screen followed
        by a duel: separate screens run in moments of the machine up to 2x apart (one tiny_batch_mlp screen of
        batch 128 read 0.50x of 64, ending its ladder; one lstm_collate screen of batch 32 read 1,089
        sequences/s where its duels read 650-750, and 64 looked 0.80x of it)."""
        key = settings_key(settings)
        if key in self._by_settings:
            return self._by_settings[key]
        if not self._can_pair(against, settings, self.estimated_peak(settings, against)):
            return self.run(settings, role)
        _, result = self.duel(against, settings, (DUEL_ROLE, role))
        if result.status is Status.OOM or (result.status is Status.STOPPED and not result.extra.get("budget_stopped")):
            # the pair held two probes' memory: out of memory beside its reference is not out of memory alone; and
            # a side stopped because its partner failed has no verdict of its own yet
            result = self._by_settings[key] = self.run(settings, role, reuse=False)
        return result

    def pairs(self, reference: ProbeResult, candidate: ProbeResult) -> bool:
        """Whether a duel of these two probes' settings would run in lockstep (`_can_pair`)."""
        return self._can_pair(reference, candidate.settings, candidate.peak_memory_bytes)

    def _can_pair(self, reference: ProbeResult, settings: dict[str, Any], peak: float | None) -> bool:
        """Whether the backend can measure `reference` beside `settings` (whose probe peaks at `peak` bytes) in a
        lockstep pair: not where it cannot pair at all (DDP, --executor ray), with different loaders (see
        `together`), or where both would not fit in memory at once (`backend.pair_memory_bytes`)."""
        if not (self.backend.can_pair and together(reference.settings, settings)):
            return False
        room = self.backend.pair_memory_bytes
        # On a GPU a process holds its allocator's reserved blocks, not only what is allocated (cuda_memory)
        held = cuda_memory.footprint(reference.peak_memory_bytes, reference.memory)
        return not (room and held + (peak or 0) > room)

    def _spec(self, probe_id: str, settings: dict[str, Any], role: str, window_s: float | None = None,
              turn_s: float | None = None, fresh: bool = False) -> ProbeSpec:
        """The backend's spec for a probe; `window_s` caps how long it measures, `turn_s` sets a lockstep side's
        turns (Protocol.turn_s), `fresh` forks it from a new parent (ProbeSpec.fresh_parent)."""
        spec = self.make_spec(probe_id, dict(settings), role, self.time_left(role))
        if fresh:
            spec = replace(spec, fresh_parent=True)
        proto = spec.protocol
        if turn_s is not None:
            proto = replace(proto, turn_s=turn_s)
        if window_s is not None and proto.max_time_s > window_s:
            proto = replace(proto, max_time_s=max(proto.min_time_s, window_s))
        return spec if proto == spec.protocol else replace(spec, protocol=proto)

    def extrapolated_peak(self, settings: dict[str, Any]) -> float | None:
        """The peak memory of `settings` on the straight line through the two largest batches measured with the
        same other settings; None with fewer than two."""
        same = without(settings, "batch_size")
        points = sorted({p.settings["batch_size"]: p.peak_memory_bytes for p in self.probes
                         if p.ok and p.peak_memory_bytes and without(p.settings, "batch_size") == same}.items())
        if len(points) < 2:
            return None
        (b0, m0), (b1, m1) = points[-2], points[-1]
        return m1 + (m1 - m0) / (b1 - b0) * (settings["batch_size"] - b1)

    def estimated_peak(self, settings: dict[str, Any], reference: ProbeResult) -> float | None:
        """The peak memory of `settings` before it ran: measured, or on the line through measured batches
        (`extrapolated_peak`), or else `reference`'s scaled in proportion to the batch, which over-estimates
        (the weights do not grow with it; on a CPU, neither do the loader workers' processes)."""
        seen = self.seen(settings)
        if seen is not None and seen.ok and seen.peak_memory_bytes:
            return seen.peak_memory_bytes
        line = self.extrapolated_peak(settings)
        if line is not None:
            return max(line, 0.0)
        if not reference.peak_memory_bytes:
            return None
        return reference.peak_memory_bytes * max(1.0, settings["batch_size"] / reference.settings["batch_size"])

    def duel(self, reference: ProbeResult, candidate: ProbeResult | dict[str, Any],
             roles: tuple[str, str] = (DUEL_ROLE, DUEL_ROLE), first: int = 0,
             window_s: float | None = None, turn_s: float | None = None,
             fresh: bool = False) -> tuple[ProbeResult, ProbeResult]:
        """Measure both settings again (`candidate`: a probe, or settings not yet measured), together in
        lockstep, step by step (`backend.pair`: probe/lockstep.py), so both see the same moments of the
        machine, each side's turns lasting about `turn_s` where given; one after the other where the backend
        cannot pair them (`_can_pair`), each then measuring at most `window_s` where given. `first` is the side
        that moves (or runs) first; `fresh`: each side forked from a new parent (ProbeSpec.fresh_parent). Returns
        the new (reference, candidate) results."""
        if isinstance(candidate, ProbeResult):
            paired = self.pairs(reference, candidate)
            candidate = candidate.settings
        else:
            paired = self._can_pair(reference, candidate, self.estimated_peak(candidate, reference))
        reference = reference.settings
        if not paired:  # in turn, each recorded as it finishes (a resumed run replays them in this order)
            sides = (reference, candidate)
            done = {i: self.run(sides[i], roles[i], reuse=False, window_s=window_s, fresh=fresh)
                    for i in ((0, 1) if first == 0 else (1, 0))}
            a, b = done[0], done[1]
        else:
            a = self._replayed(reference, roles[0])
            b = self._replayed(candidate, roles[1]) if a is not None else None
            if a is not None and b is None:  # the replay ended between the two: keep that probe, run the pair anew
                self._record(a)
            if b is None:
                n = len(self.probes)
                specs = [self._spec(f"p{n + 1:03d}", reference, roles[0], turn_s=turn_s, fresh=fresh),
                         self._spec(f"p{n + 2:03d}", candidate, roles[1], turn_s=turn_s, fresh=fresh)]
                a, b = self.backend.pair(specs, list(roles), first)
            for result, role in ((a, roles[0]), (b, roles[1])):
                result.role = result.role or role
                self._record(result)
                self._by_settings.setdefault(settings_key(result.settings), result)
        self._duels.setdefault((settings_key(reference), settings_key(candidate)), []).append((a, b))
        return a, b

    def run_many(self, settings_list: list[dict[str, Any]], role: str) -> list[ProbeResult]:
        """Independent probes together where the backend runs several side by side (`backend.width` from 2:
        --executor ray), each recorded as it finishes; one after another otherwise, and while replaying a resumed
        run."""
        fresh = [s for s in settings_list if settings_key(s) not in self._by_settings]
        if self.backend.width < 2 or self._replay or len(fresh) < 2:
            return [self.run(s, role) for s in settings_list]
        jobs = [(self._spec(f"p{len(self.probes) + 1 + i:03d}", s, role), role) for i, s in enumerate(fresh)]
        for result in self.backend.many(jobs):
            result.role = result.role or role
            self._record(result)
            self._by_settings.setdefault(settings_key(result.settings), result)
        return [self._by_settings[settings_key(s)] for s in settings_list]

    def skip(self, settings: dict[str, Any], role: str, reason: str) -> ProbeResult:
        """Record a probe that was not run (not applicable), so the report says why."""
        key = settings_key(settings)
        if key in self._by_settings:
            return self._by_settings[key]
        result = self._replayed(settings, role) or ProbeResult(
            id=f"p{len(self.probes) + 1:03d}", settings=dict(settings), status=Status.SKIPPED, error=reason, role=role)
        self._record(result)
        self._by_settings[key] = result
        return result

    # --- comparing, noise-aware ---------------------------------------------------------------------------------

    def runs(self, settings: dict[str, Any], paired: bool | None = None) -> list[ProbeResult]:
        """The finished probes of these settings with a measured window, of one kind (`figures.runs`)."""
        return figures.runs(self.probes, settings, paired)

    def samples(self, settings: dict[str, Any], paired: bool = False) -> tuple[list[float], list[float]]:
        """Items and step times of every finished probe of these settings of one kind, pooled: re-checks add
        evidence."""
        runs = self.runs(settings, paired)
        return [x for p in runs for x in p.items], [x for p in runs for x in p.step_s]

    def figure(self, settings: dict[str, Any], unit: str = "samples/s") -> dict[str, Any] | None:
        """The throughput a report prints for `settings` on their own (`figures.figure`)."""
        return figures.figure(self.probes, settings, unit, self.session_drift)

    def figures(self, base: dict[str, Any], rec: dict[str, Any], speedup: dict[str, Any] | None,
                unit: str = "samples/s") -> dict[str, dict[str, Any] | None]:
        """The baseline's and the recommendation's figures on one level (`figures.figures`)."""
        return figures.figures(self.probes, base, rec, speedup, unit, self.session_drift)

    def drift(self) -> tuple[float, int]:
        """The run-to-run spread of throughput over this session's probes (`figures.drift`)."""
        return figures.drift(self.probes)

    def common_kind(self, *settings: dict[str, Any]) -> bool | None:
        """The kind of measure (paired: True, alone: False) that every one of `settings` has; alone where both
        kinds do; None where none is common."""
        for paired in (False, True):
            if all(self.runs(s, paired) for s in settings):
                return paired
        return None

    def _record(self, result: ProbeResult) -> None:
        if result.extra.get("budget_stopped") and not self.runs(result.settings):  # measured already: explored
            where = knobs.describe(result.settings, self.baseline.settings) if self.baseline else "the baseline"
            self.unexplored.append(f"{where}: stopped when the budget ran out ({result.id})")
        self.probes.append(result)
        if self.on_probe:
            self.on_probe(result)


def protocol_for(role: str, protocol: Protocol, left_s: float | None) -> Protocol:
    """The measurement protocol of a probe of `role`: screening probes measure at most SCREEN_MAX_S, a duel's
    at most DUEL_MAX_S, and every probe stops extending its measurement in time to leave a result within
    `left_s` (what is left of the budget for it)."""
    cap = protocol.max_time_s
    if role.startswith(SCREENING_ROLES):
        cap = min(cap, SCREEN_MAX_S)
    elif role == DUEL_ROLE or role.startswith(ablation.ROLE):
        cap = min(cap, DUEL_MAX_S)
    if left_s is not None:
        cap = min(cap, left_s / 2)
    cap = max(protocol.min_time_s, cap)
    return protocol if cap == protocol.max_time_s else replace(protocol, max_time_s=cap)


