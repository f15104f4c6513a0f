"""What every planner shares: the probe session and its budget, the noise-aware comparison, the confirmation.

Planners talk to the world only through the Session, which has probes run by a ProbeBackend (probe/backend.py),
so tests drive them with a fake backend in milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from .. import knobs
from ..analysis import parity, stats
from ..probe.backend import ProbeBackend, SpecMaker, bare_spec
from ..probe.result import ProbeResult, Status
from ..probe.spec import ProbeSpec, Protocol
from . import ablation
from .keep import DUEL_ROLE, MIN_GAIN, together, without

# Separate probes a few seconds apart can run in different speed states of the machine (this 2-core VM swings about
# 30% for seconds at a time), so their ratio alone does not decide a change between these bounds: a probe pair
# measured in lockstep (Session.duel) does. Below DUEL_FROM the change is dropped; from a median of CLEAR_GAIN it
# is kept without one, if its CI also clears the minimum gain: no swing of the machine makes that much.
DUEL_FROM = 0.9
# A loader-bound pipeline is bursty: its 3 s screening probes swing further (augment_cpu: 3 and 4 loader workers
# screened at 0.81x and 0.89x of 2, where the grid's probes of 2 to 8 workers lie within 15% of each other).
LOADER_DUEL_FROM = 0.75
CLEAR_GAIN = 1.5
MAX_DUELS = 3  # per comparison: a gain still inconclusive after a duel earns another, up to this many
MIN_RUNS = 3  # runs per side from which their spread, not the steps', measures the noise (duels in turn add them)
# Baseline and winner measured together in lockstep, three rounds (the first mover alternates): the speedup's CI
# uses Student's t over the rounds, and two rounds leave one degree of freedom (t = 12.7). A third round is run
# while the budget allows it; two are the least.
CONFIRM_ROUNDS = 3
CONFIRM_MIN_ROUNDS = 2
# Then each of the two once more alone, so that its printed figure rests on separate runs of the kind training sees
# (a lockstep partner's turns leave the caches cold) and its interval on the drift between them.
CONFIRM_ALONE = 1
# Probes that explore only screen: they decide the clear cases and duels decide the rest, so measuring one
# longer buys little. A noisy one, on a machine whose speed swings, would otherwise run to its cap.
SCREEN_MAX_S = 3.0
SCREENING_ROLES = ("knob:", "ladder:", "bisect:")
# A duel's probes measure at most this long: a lockstep ratio that can settle does so in a second or two, and a
# duel in turn adds one run to each side's runs, whose spread measures the noise (a loader-bound probe would
# otherwise extend to its cap: io_bound's 16 against 32 workers took 6.0 + 9.8 s).
DUEL_MAX_S = 4.0
ABLATION_START_S = 2.0  # a lockstep side's start and warm-up, beyond its measured window
CONFIRM_RESERVE = 2 * (CONFIRM_MIN_ROUNDS + CONFIRM_ALONE)  # probes kept back from the budget for the confirmation
# The confirmation may run this far past --budget (the contract is "within 10%"): it is what the recommendation
# rests on, and its probes' wall times vary with the machine's speed. Exploring probes stop where it must begin.
CONFIRM_GRACE = 0.05


@dataclass
class PlanContext:
    baseline: dict[str, Any]  # every knob
    search: dict[str, list]  # the workload's SEARCH
    workload: knobs.WorkloadFacts
    device: knobs.DeviceFacts
    memory_budget_bytes: int | None = None
    explore: tuple[str, ...] | None = None  # --knobs: the only knobs the adaptive planner explores; None: all


@dataclass
class Outcome:
    strategy: str
    baseline: ProbeResult
    recommended: ProbeResult
    speedup: dict[str, Any] | None
    probes: list[ProbeResult]
    unexplored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)  # why each knob was kept, dropped or skipped
    frontier: dict[str, Any] | None = None  # the batch-size memory frontier, when one was found
    ablation: list[dict[str, Any]] = field(default_factory=list)  # each changed knob's measured contribution

    def plan_summary(self) -> dict[str, Any]:
        """The `plan` object of results.json."""
        return {"strategy": self.strategy, "decisions": list(self.decisions), "frontier": self.frontier,
                "ablation": list(self.ablation)}


class Unexplored(list):
    """What the plan left unexplored, each entry once: a re-opened ladder stops at the same plateau again."""

    def append(self, entry: str) -> None:
        if entry not in self:
            super().append(entry)

    def extend(self, entries) -> None:
        for entry in entries:
            self.append(entry)


class Session:
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
                 make_spec: SpecMaker = bare_spec):
        self.backend, self.make_spec = backend, make_spec
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
        walls = [_plain_wall(p) for p in self.probes if p.wall_s > 0]
        return sum(walls) / len(walls) if walls else 0.0

    def affordable(self, probes: int = 1, extra_s: float = 0.0) -> bool:
        """Whether `probes` more (costing `extra_s` beyond typical probes: compilation), and then the
        confirmation, fit in what is left of the budget."""
        if self.budget_s is None:
            return True
        needed = probes * self.typical_probe_s() + extra_s + self.confirmation_s()
        return self.elapsed() + needed <= self.budget_s

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
        the current best changes) and the confirmation, which re-runs the baseline and the current best
        CONFIRM_MIN_ROUNDS times each in lockstep and CONFIRM_ALONE times alone (a further round only where time
        is left then): their own wall times predict it best."""
        if self.baseline is None:
            return CONFIRM_RESERVE * self.typical_probe_s()
        best = self.best if self.best is not None else self.baseline
        confirming = (CONFIRM_MIN_ROUNDS + CONFIRM_ALONE) * (_plain_wall(self.baseline) + _plain_wall(best))
        if ablations is None:
            ablations = len(ablation.ablatable(self.baseline.settings, best.settings))
        return confirming + self.ablation_pair_s() * ablations

    def ablation_pair_s(self) -> float:
        """One ablation pair: each side measures at most DUEL_MAX_S beyond its start-up."""
        best = self.best if self.best is not None else self.baseline
        return 2 * min(_plain_wall(best), DUEL_MAX_S + ABLATION_START_S) if best is not None else 0.0

    def affords_ablation(self, left: int) -> bool:
        """Whether the next ablation pair, the `left - 1` after it and the confirmation fit in the budget."""
        return self.budget_s is None or self.elapsed() + self.confirmation_s(left) <= self.budget_s

    def seen(self, settings: dict[str, Any]) -> ProbeResult | None:
        return self._by_settings.get(_key(settings))

    def run(self, settings: dict[str, Any], role: str, reuse: bool = True) -> ProbeResult:
        key = _key(settings)
        if reuse and key in self._by_settings:
            return self._by_settings[key]
        result = self._replayed(settings, role) or self.backend.run(
            self._spec(f"p{len(self.probes) + 1:03d}", settings, role), role)
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
        key = _key(settings)
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

    def _can_pair(self, reference: ProbeResult, settings: dict[str, Any], peak: float | None) -> bool:
        """Whether the backend can measure `reference` beside `settings` (whose probe peaks at `peak` bytes) in a
        lockstep pair: not where it cannot pair at all (DDP, --executor ray), with different loaders (see
        `together`), or where both would not fit in memory at once (`backend.pair_memory_bytes`)."""
        if not (self.backend.can_pair and together(reference.settings, settings)):
            return False
        room = self.backend.pair_memory_bytes
        return not (room and (reference.peak_memory_bytes or 0) + (peak or 0) > room)

    def _spec(self, probe_id: str, settings: dict[str, Any], role: str) -> ProbeSpec:
        return self.make_spec(probe_id, dict(settings), role, self.time_left(role))

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
             roles: tuple[str, str] = (DUEL_ROLE, DUEL_ROLE), first: int = 0) -> tuple[ProbeResult, ProbeResult]:
        """Measure both settings again (`candidate`: a probe, or settings not yet measured), together in
        lockstep, step by step (`backend.pair`: probe/lockstep.py), so both see the same moments of the
        machine; one after the other where the backend cannot pair them (`_can_pair`). `first` is the side that
        moves (or runs) first. Returns the new (reference, candidate) results."""
        if isinstance(candidate, ProbeResult):
            paired = self._can_pair(reference, candidate.settings, candidate.peak_memory_bytes)
            candidate = candidate.settings
        else:
            paired = self._can_pair(reference, candidate, self.estimated_peak(candidate, reference))
        reference = reference.settings
        if not paired:  # in turn, each recorded as it finishes (a resumed run replays them in this order)
            sides = (reference, candidate)
            done = {i: self.run(sides[i], roles[i], reuse=False) for i in ((0, 1) if first == 0 else (1, 0))}
            a, b = done[0], done[1]
        else:
            a = self._replayed(reference, roles[0])
            b = self._replayed(candidate, roles[1]) if a is not None else None
            if a is not None and b is None:  # the replay ended between the two: keep that probe, run the pair anew
                self._record(a)
            if b is None:
                n = len(self.probes)
                specs = [self._spec(f"p{n + 1:03d}", reference, roles[0]),
                         self._spec(f"p{n + 2:03d}", candidate, roles[1])]
                a, b = self.backend.pair(specs, list(roles), first)
            for result, role in ((a, roles[0]), (b, roles[1])):
                result.role = result.role or role
                self._record(result)
                self._by_settings.setdefault(_key(result.settings), result)
        self._duels.setdefault((_key(reference), _key(candidate)), []).append((a, b))
        return a, b

    def run_many(self, settings_list: list[dict[str, Any]], role: str) -> list[ProbeResult]:
        """Independent probes together where the backend runs several side by side (`backend.width` from 2:
        --executor ray), each recorded as it finishes; one after another otherwise, and while replaying a resumed
        run."""
        fresh = [s for s in settings_list if _key(s) not in self._by_settings]
        if self.backend.width < 2 or self._replay or len(fresh) < 2:
            return [self.run(s, role) for s in settings_list]
        jobs = [(self._spec(f"p{len(self.probes) + 1 + i:03d}", s, role), role) for i, s in enumerate(fresh)]
        for result in self.backend.many(jobs):
            result.role = result.role or role
            self._record(result)
            self._by_settings.setdefault(_key(result.settings), result)
        return [self._by_settings[_key(s)] for s in settings_list]

    def skip(self, settings: dict[str, Any], role: str, reason: str) -> ProbeResult:
        """Record a probe that was not run (not applicable), so the report says why."""
        key = _key(settings)
        if key in self._by_settings:
            return self._by_settings[key]
        result = self._replayed(settings, role) or ProbeResult(
            id=f"p{len(self.probes) + 1:03d}", settings=dict(settings), status=Status.SKIPPED, error=reason, role=role)
        self._record(result)
        self._by_settings[key] = result
        return result

    # --- comparing, noise-aware ---------------------------------------------------------------------------------

    def runs(self, settings: dict[str, Any], paired: bool | None = None) -> list[ProbeResult]:
        """The finished probes of these settings with a measured window; `paired`: only those measured beside a
        lockstep partner (True) or alone (False). The two kinds differ systematically (a partner's turns leave
        the caches cold: one tiny model read 41,847 samples/s alone and 17,556 beside its partner), so they are
        never mixed in one comparison."""
        return [p for p in self.probes if p.ok and p.measured and p.settings == settings
                and (paired is None or (p.paired_with is not None) == paired)]

    def samples(self, settings: dict[str, Any], paired: bool = False) -> tuple[list[float], list[float]]:
        """Items and step times of every finished probe of these settings of one kind, pooled: re-checks add
        evidence."""
        runs = self.runs(settings, paired)
        return [x for p in runs for x in p.items], [x for p in runs for x in p.step_s]

    def figure(self, settings: dict[str, Any], unit: str = "samples/s") -> dict[str, Any] | None:
        """The throughput a report prints for `settings`: the best-founded estimate from all its measures in the
        run, from runs of one kind: measured alone (what training sees) when there are any, else beside a lockstep
        partner (whose turns leave the caches cold: never pooled with the others). Their geometric mean, and the
        95% prediction interval of one more run (`stats.prediction_interval`), its spread from every setting of
        that kind run more than once in this session (`drift`); with no repeated run at all, the one window's
        CI, labelled as such. None without a measured run."""
        alone = self.runs(settings, paired=False)
        runs = alone or self.runs(settings, paired=True)
        if not runs:
            return None
        kind = "alone" if alone else "beside a partner"
        spread = self.drift(paired=not alone)
        if spread[1] == 0:
            median, low, high = runs[0].throughput()
            interval = f"95% CI within one measured window ({runs[0].id}, {kind}): a re-run may fall outside it"
        else:
            median, low, high = stats.prediction_interval([window_rate(p) for p in runs], spread)
            interval = (f"95% prediction interval of one more run, from {len(runs)} run{'s' if len(runs) > 1 else ''}"
                        f" ({kind}), the drift between runs from every repeated setting ({spread[1]} degrees of "
                        "freedom)")
        return {"median": median, "ci_low": low, "ci_high": high, "unit": unit, "interval": interval,
                "runs": [p.id for p in runs]}

    def drift(self, paired: bool) -> tuple[float, int]:
        """(log sd, degrees of freedom) of the run-to-run spread of throughput, pooled over every setting that has
        two or more measured runs of this kind (`stats.pooled_log_sd`)."""
        groups: dict[tuple, list[float]] = {}
        for p in self.probes:
            if p.ok and p.measured and (p.paired_with is not None) == paired:
                groups.setdefault(_key(p.settings), []).append(window_rate(p))
        return stats.pooled_log_sd(list(groups.values()))

    def lockstep_drift(self) -> tuple[float, int]:
        """(log sd, degrees of freedom) of the round-to-round spread of lockstep ratios, pooled over every pair of
        settings compared in lockstep more than once (duels, confirmation rounds)."""
        groups = []
        for pairs in self._duels.values():
            done = [(a, b) for a, b in pairs if a.ok and b.ok and "lockstep" in a.extra and "lockstep" in b.extra]
            groups.append([window_rate(b) / window_rate(a) for a, b in done])
        return stats.pooled_log_sd(groups)

    def common_kind(self, *settings: dict[str, Any]) -> bool | None:
        """The kind of measure (paired: True, alone: False) that every one of `settings` has; alone where both
        kinds do; None where none is common."""
        for paired in (False, True):
            if all(self.runs(s, paired) for s in settings):
                return paired
        return None

    def gain(self, reference: ProbeResult, candidate: ProbeResult) -> tuple[float, float, float]:
        """Throughput ratio candidate/reference: (median, ci_low, ci_high); NaNs when either failed. From their
        lockstep duels when they had one (each step beside its partner); else, with MIN_RUNS runs or more of each,
        over the runs (each run's throughput one sample); else over their pooled steps."""
        if not (reference.ok and candidate.ok):
            return float("nan"), float("nan"), float("nan")
        duels = self._lockstep(reference, candidate)
        if duels:
            return pair_ratio(duels, waves=(reference.wave, candidate.wave))
        paired = self.common_kind(reference.settings, candidate.settings)
        if paired is None:
            return float("nan"), float("nan"), float("nan")
        runs = [[window_rate(p) for p in self.runs(side.settings, paired)] for side in (reference, candidate)]
        if min(map(len, runs)) >= MIN_RUNS:  # enough separate runs to see how reproducible each side is
            return stats.runs_ratio_ci(*runs)
        return stats.ratio_ci(*self.samples(reference.settings, paired), *self.samples(candidate.settings, paired),
                              seed=0, waves=(reference.wave, candidate.wave))

    def dueled(self, reference: ProbeResult, candidate: ProbeResult) -> bool:
        """Whether the two were measured again together, both sides to the end (a pair whose one side failed
        compared nothing)."""
        ref, cand = _key(reference.settings), _key(candidate.settings)
        return any(a.ok and b.ok for a, b in self._duels.get((ref, cand), []) + self._duels.get((cand, ref), []))

    def beats(self, reference: ProbeResult, candidate: ProbeResult, duel_from: float = DUEL_FROM) -> bool:
        """A gain larger than the noise: at least MIN_GAIN, and the ratio's 95% CI excludes 1.

        Separate probes decide only the clear cases (a ratio under `duel_from`, or from CLEAR_GAIN). Between
        them both are measured again in a duel, together in lockstep where they can be; a gain still promising
        but inconclusive after it (loader-bound probes are bursty) earns another, up to MAX_DUELS, while the
        budget allows. Without the budget for one, the evidence so far decides."""
        median, low, _ = self.gain(reference, candidate)
        unknown = median != median  # failed, or no measures of one kind (alone / paired) on both sides
        if (unknown and not (reference.ok and candidate.ok)) or median < duel_from or (
                median >= CLEAR_GAIN and low >= 1 + MIN_GAIN):
            return self._won(reference, candidate)
        for _ in range(MAX_DUELS - len(self._duels.get((_key(reference.settings), _key(candidate.settings)), []))):
            dueled = self.dueled(reference, candidate)
            if dueled and not (median >= 1 + MIN_GAIN and low <= 1.0):
                break  # decided
            again_s = max(0.0, _plain_wall(reference) + _plain_wall(candidate) - 2 * self.typical_probe_s())
            if not self.affordable(2, extra_s=again_s):
                break
            a, b = self.duel(reference, candidate, first=sum(map(len, self._duels.values())) % 2)  # alternate
            if not (a.ok and b.ok):
                break
            median, low, _ = self.gain(reference, candidate)
        return self._won(reference, candidate)

    def _won(self, reference: ProbeResult, candidate: ProbeResult) -> bool:
        """Whether the evidence so far shows a gain beyond the noise; a gain shown in lockstep is remembered as
        a link for chained_gain. (Not a clear gain of separate probes: each carries its moment of the machine,
        and a product of such ratios compounds them. One tiny_batch_mlp chain of four screens multiplied to
        31x, where the ends' own probes measured 13.5x.)"""
        gain = median, low, _ = self.gain(reference, candidate)
        won = median >= 1 + MIN_GAIN and low > 1.0
        if won and self._lockstep(reference, candidate):
            self._lockstep_wins[_key(candidate.settings)] = (_key(reference.settings), gain)
        return won

    def chained_gain(self, reference: ProbeResult, candidate: ProbeResult) -> tuple[float, float, float] | None:
        """The gain candidate/reference over a chain of lockstep wins, reference -> ... -> candidate (a ladder's
        rungs, each kept in a lockstep duel), or None without one: the ratios multiply, and the
        half-widths of their log CIs add in quadrature (the duels are independent measurements). It spares
        the ladder's start and end a duel of their own (hf_transformer's batch 8 -> 16 -> 32 had
        taken one of 11 s)."""
        links, key, start = [], _key(candidate.settings), _key(reference.settings)
        while key != start:
            if key not in self._lockstep_wins or len(links) >= len(self._lockstep_wins):
                return None
            key, gain = self._lockstep_wins[key]
            links.append(gain)
        if len(links) < 2:
            return None  # one link is the direct comparison
        logs = np.log(np.array(links))  # rows: (median, low, high)
        half = np.sqrt(np.sum(((logs[:, 2] - logs[:, 1]) / 2) ** 2))
        centre = logs[:, 0].sum()
        return float(np.exp(centre)), float(np.exp(centre - half)), float(np.exp(centre + half))

    def _lockstep(self, reference: ProbeResult, candidate: ProbeResult) -> list | None:
        """The lockstep duels of these two as (reference, candidate) pairs, whichever side each was run as, if
        every one of them ran in lockstep."""
        ref, cand = _key(reference.settings), _key(candidate.settings)
        duels = self._duels.get((ref, cand), []) + [(b, a) for a, b in self._duels.get((cand, ref), [])]
        return duels if duels and all("lockstep" in r.extra for pair in duels for r in pair) else None

    def describe_gain(self, reference: ProbeResult, candidate: ProbeResult, chained: bool = False) -> str:
        """The gain with its CI and where it comes from (`chained`: over the chain of lockstep wins)."""
        median, low, high = self.chained_gain(reference, candidate) if chained else self.gain(reference, candidate)
        if median != median:
            return f"{candidate.status.value}"
        duels = self._lockstep(reference, candidate)
        if chained:
            how = "over its chain of ladder wins in lockstep"
        elif duels:
            how = f"in lockstep, {' & '.join(f'{a.id}/{b.id}' for a, b in duels)}"
        else:
            how = f"over {reference.id}"
        return f"{median:.2f}x [{low:.2f}, {high:.2f}] {how}"

    def _record(self, result: ProbeResult) -> None:
        if result.extra.get("budget_stopped"):
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


def window_rate(probe: ProbeResult) -> float:
    """Items per second over the probe's measured window (NaN without one)."""
    return sum(probe.items) / sum(probe.step_s) if probe.measured else float("nan")


def pair_ratio(pairs: list[tuple[ProbeResult, ProbeResult]],
               waves: tuple[int, int] = (1, 1)) -> tuple[float, float, float]:
    """candidate/reference throughput over (reference, candidate) probe pairs: (median, ci_low, ci_high).

    Pairs measured in lockstep have step k of one side next to step k of the other, so the bootstrap resamples
    the same blocks of steps on both sides and the moments they shared cancel. Pairs run one after the other
    (no `lockstep` in extra, or unequal step counts) are resampled independently."""
    ok = [(a, b) for a, b in pairs if a.ok and b.ok and a.measured and b.measured]
    if not ok:
        return float("nan"), float("nan"), float("nan")
    paired = all("lockstep" in a.extra and "lockstep" in b.extra and len(a.step_s) == len(b.step_s) for a, b in ok)
    pooled = [[x for pair in ok for x in getattr(pair[side], attr)] for side in (0, 1) for attr in ("items", "step_s")]
    return stats.ratio_ci(*pooled, seed=0, waves=waves, paired=paired)


def _plain_wall(probe: ProbeResult) -> float:
    """A probe's wall time without the profiler's extra steps: only designated probes are profiled, so this is
    what other probes of those settings take."""
    return max(0.0, probe.wall_s - (probe.extra.get("profile_wall_s") or 0.0))


def _key(settings: dict[str, Any]) -> tuple:
    return tuple(sorted(settings.items()))


def confirm(session: Session, base: ProbeResult, winner: ProbeResult,
            notes: list[str]) -> tuple[ProbeResult, dict[str, Any] | None]:
    """Measure baseline and winner together in lockstep rounds (CONFIRM_MIN_ROUNDS, then up to CONFIRM_ROUNDS
    while the budget allows; the first mover alternates): drift hits both alike. Then each once more alone, for
    the figures the report prints. Returns (recommended, speedup).

    The speedup is the geometric mean of the rounds' ratios, with a 95% CI from Student's t over the rounds
    (`stats.rounds_ratio_interval`), so it covers the drift between rounds. The winner stays recommended only if
    that CI shows a gain beyond the noise too. A round that fails (the budget ran out in it, say) leaves the rounds
    before it to decide, with a note.
    """
    rounds = []
    for i in range(CONFIRM_ROUNDS):
        if i >= CONFIRM_MIN_ROUNDS and not _affords_round(session, base, winner):
            break
        a, b = session.duel(base, winner, ("confirm:baseline", "confirm:recommended"), first=i % 2)
        rounds.append((a, b))
        if not (a.ok and b.ok):
            break
    failed = next((r for pair in rounds for r in pair if not r.ok), None)
    finished = [(a, b) for a, b in rounds if a.ok and b.ok and a.measured and b.measured]
    if failed is not None:
        keeps = (f"the speedup comes from the {len(finished)} round{'s' if len(finished) != 1 else ''} that "
                 "finished" if finished else "keeping the baseline")
        notes.append(f"confirmation probe {failed.id} failed ({failed.status.value}: {failed.error}); {keeps}")
        if not finished:
            return base, None
    _, within_low, within_high = pair_ratio(finished, waves=(base.wave, winner.wave))
    lockstep = all("lockstep" in r.extra for pair in finished for r in pair)
    spread = session.lockstep_drift() if lockstep else None
    median, low, high = stats.rounds_ratio_interval([window_rate(b) / window_rate(a) for a, b in finished],
                                                    within=(within_low, within_high), spread=spread)
    how = ("measured together in lockstep, step by step" if lockstep
           else "measured one after the other, in alternating order")
    rounds_text = f"{len(finished)} round{'s' if len(finished) != 1 else ''}"
    if len(finished) >= 2 or (spread and spread[1]):
        interval = (f"95% CI of the geometric mean of the {rounds_text}' ratios, Student's t over the rounds (the "
                    "drift between rounds counts), at least as wide as the CI from their steps")
    else:
        interval = "95% bootstrap CI of the ratio over one round's steps: within one window"
    speedup = {"median": median, "ci_low": low, "ci_high": high,
               "method": f"baseline and recommended {how}, {rounds_text}", "interval": interval,
               "probes": [r.id for pair in rounds for r in pair]}
    for settings, role in ((winner.settings, "confirm:alone:recommended"), (base.settings, "confirm:alone:baseline")):
        for _ in range(CONFIRM_ALONE):
            left = session.time_left(role)
            if left is not None and left < _plain_wall(winner if settings == winner.settings else base):
                break
            alone = session.run(settings, role, reuse=False)
            speedup["probes"].append(alone.id)
    if not (median >= 1 + MIN_GAIN and low > 1.0):
        notes.append(f"the confirmation measured {median:.2f}x [{low:.2f}, {high:.2f}] for "
                     f"{knobs.describe(winner.settings, base.settings)}: within noise, so the baseline "
                     "stays recommended")
        return base, speedup
    return winner, speedup


def _affords_round(session: Session, base: ProbeResult, winner: ProbeResult) -> bool:
    """Whether one more lockstep round and the runs alone after it fit before the confirmation's deadline."""
    left = session.time_left("confirm:baseline")
    one = _plain_wall(base) + _plain_wall(winner)
    return left is None or left >= one * (1 + CONFIRM_ALONE)


class Planner:
    """What every strategy shares: the baseline first, the confirmation last, the Outcome."""

    strategy = ""

    def __init__(self, ctx: PlanContext, session: Session):
        self.ctx, self.session = ctx, session
        self.notes: list[str] = []
        self.decisions: list[str] = []
        self.frontier: dict[str, Any] | None = None
        self.loss_changed: dict[tuple, str] = {}  # numeric knob values found to change the loss -> why
        self.ablation: list[dict[str, Any]] = []  # each changed knob's measured contribution (planner/ablation.py)

    def changes_loss(self, result: ProbeResult) -> str | None:
        """Why `result` must not be recommended because its numeric knobs (AMP, compile, matmul precision) changed
        the loss against float32 at the same settings; None when they did not, or when that is not known.

        Once a knob value changes the loss it is barred everywhere: probes at other batch sizes have no float32
        twin to compare with, and the arithmetic that drifted is the same.
        """
        changes = parity.numeric_changes(result.settings)
        if not changes or not result.ok:
            return None
        key = tuple(sorted(changes.items()))
        if key not in self.loss_changed:
            reference = self.session.seen(parity.reference_settings(result.settings))
            # At the same global steps: a compiled probe warms up longer, so its measured steps start later.
            found = (parity.compare_probes(reference, result)
                     if reference is not None and reference.ok else None)
            if found is not None and not found.ok:
                self.loss_changed[key] = parity.describe(changes, found) + f" ({reference.id} vs {result.id})"
                self.notes.append(self.loss_changed[key] + ": not recommended, whatever its speed")
        for item in changes.items():  # a single knob value barred also bars it in combination
            if (item,) in self.loss_changed:
                return self.loss_changed[(item,)]
        return self.loss_changed.get(key)

    def run(self) -> Outcome:
        base = self.session.run(self.ctx.baseline, "baseline")
        self.session.baseline = base
        if not base.ok:
            self.notes.append(f"the baseline probe failed ({base.status.value}): nothing to compare against; "
                              "fix that first")
            return self.outcome(base, base, None)
        winner = self.search(base)
        if winner is base or winner.settings == base.settings:
            return self.outcome(base, base, None)
        self.session.best = winner
        winner, self.ablation = ablation.ablate(self.session, base, winner, self.notes, self.decisions)
        if winner.settings == base.settings:
            return self.outcome(base, base, None)
        recommended, speedup = confirm(self.session, base, winner, self.notes)
        return self.outcome(base, recommended, speedup)

    def search(self, base: ProbeResult) -> ProbeResult:
        """The strategy: probes after the baseline; returns the fastest configuration found."""
        raise NotImplementedError

    def outcome(self, base: ProbeResult, recommended: ProbeResult, speedup: dict[str, Any] | None) -> Outcome:
        s = self.session
        return Outcome(self.strategy, base, recommended, speedup, s.probes, s.unexplored, self.notes,
                       self.decisions, self.frontier, self.ablation)
