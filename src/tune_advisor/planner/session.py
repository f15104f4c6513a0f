"""What every planner shares: the probe session and its budget, the noise-aware comparison, the confirmation.

Planners talk to the world only through `Session.run`, a callable from settings to a ProbeResult, so tests drive
them with a fake runner in milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import knobs
from ..analysis import parity, stats
from ..probe.result import ProbeResult, Status

MIN_GAIN = 0.03  # a change must beat its reference by 3% (and its ratio CI must exclude 1) to be kept
RECHECK_GAIN = 0.10  # an inconclusive gain at least this large is measured again before it is judged
CONFIRM_ROUNDS = 2  # baseline and winner re-measured A B A B
CONFIRM_RESERVE = 2 * CONFIRM_ROUNDS  # probes kept back from the budget for the confirmation


@dataclass
class PlanContext:
    baseline: dict[str, Any]  # every knob
    search: dict[str, list]  # the workload's SEARCH
    workload: knobs.WorkloadFacts
    device: knobs.DeviceFacts
    memory_budget_bytes: int | None = None


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

    def plan_summary(self) -> dict[str, Any]:
        """The `plan` object of results.json."""
        return {"strategy": self.strategy, "decisions": list(self.decisions), "frontier": self.frontier}


Runner = Callable[[str, dict[str, Any], str], ProbeResult]  # (probe id, settings, role) -> result


class Session:
    """Runs probes through `runner`, numbers them, reuses identical settings, and keeps the wall-time budget.

    `started` lets the budget include work done before planning (inspecting the workload).

    `finished` resumes an interrupted run: its probes as (result, session elapsed seconds when it was recorded),
    in run order. The planner is deterministic given its probe results, so it asks for the same probes again, and
    each is handed back instead of run ("replayed"), with the clock standing at the time it was recorded then, so
    budget decisions come out as they did. The first request that differs (e.g. a smaller budget now) ends the
    replay: the rest are `discarded` and the plan goes on live. Afterwards the budget counts the interrupted
    run's time up to its last finished probe plus this run's own.
    """

    def __init__(self, runner: Runner, budget_s: float | None = None,
                 on_probe: Callable[[ProbeResult], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 started: float | None = None, finished: list[tuple[ProbeResult, float]] | None = None):
        self.runner, self.budget_s, self.on_probe, self.clock = runner, budget_s, on_probe, clock
        self.started = clock() if started is None else started
        self._replay = list(finished or [])
        self._carried = self._replay[-1][1] if self._replay else 0.0  # the interrupted run's time
        first = self._replay[0] if self._replay else None
        self._replay_clock = max(0.0, first[1] - first[0].wall_s) if first else 0.0
        self.reused: list[ProbeResult] = []
        self.discarded: list[ProbeResult] = []
        self.probes: list[ProbeResult] = []
        self.unexplored: list[str] = []
        self._by_settings: dict[tuple, ProbeResult] = {}
        self._rechecked: set[tuple] = set()
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

    def confirmation_s(self) -> float:
        """The confirmation re-runs the baseline and the current best CONFIRM_ROUNDS times each: their own wall
        times predict it best."""
        if self.baseline is None:
            return CONFIRM_RESERVE * self.typical_probe_s()
        best = self.best if self.best is not None else self.baseline
        return CONFIRM_ROUNDS * (_plain_wall(self.baseline) + _plain_wall(best))

    def seen(self, settings: dict[str, Any]) -> ProbeResult | None:
        return self._by_settings.get(_key(settings))

    def run(self, settings: dict[str, Any], role: str, reuse: bool = True) -> ProbeResult:
        key = _key(settings)
        if reuse and key in self._by_settings:
            return self._by_settings[key]
        result = self._replayed(settings, role) or self.runner(f"p{len(self.probes) + 1:03d}", dict(settings), role)
        result.role = result.role or role
        self._record(result)
        self._by_settings.setdefault(key, result)
        return result

    def run_many(self, settings_list: list[dict[str, Any]], role: str) -> list[ProbeResult]:
        """Independent probes together when the runner runs probes side by side (`runner.many`: --executor ray),
        each recorded as it finishes; one after another otherwise, and while replaying a resumed run."""
        many = getattr(self.runner, "many", None)
        fresh = [s for s in settings_list if _key(s) not in self._by_settings]
        if many is None or self._replay or len(fresh) < 2:
            return [self.run(s, role) for s in settings_list]
        jobs = [(f"p{len(self.probes) + 1 + i:03d}", dict(s), role) for i, s in enumerate(fresh)]
        for result in many(jobs):
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

    def samples(self, settings: dict[str, Any]) -> tuple[list[float], list[float]]:
        """Items and step times of every finished probe of these settings, pooled: re-checks add evidence."""
        runs = [p for p in self.probes if p.ok and p.settings == settings]
        return [x for p in runs for x in p.items], [x for p in runs for x in p.step_s]

    def gain(self, reference: ProbeResult, candidate: ProbeResult) -> tuple[float, float, float]:
        """Throughput ratio candidate/reference over their pooled samples: (median, ci_low, ci_high); NaNs when
        either failed."""
        if not (reference.ok and candidate.ok):
            return float("nan"), float("nan"), float("nan")
        return stats.ratio_ci(*self.samples(reference.settings), *self.samples(candidate.settings), seed=0,
                              waves=(reference.wave, candidate.wave))

    def beats(self, reference: ProbeResult, candidate: ProbeResult) -> bool:
        """A gain larger than the noise: at least MIN_GAIN, and the ratio's 95% CI excludes 1.

        A promising but inconclusive gain (median past RECHECK_GAIN, CI reaching 1) earns one re-check: both are
        measured once more, back to back, and the pooled samples decide. Loader-bound probes in particular are
        bursty, and one short probe can hide a real gain; smaller gains are not worth two more probes."""
        median, low, _ = self.gain(reference, candidate)
        pair = (_key(reference.settings), _key(candidate.settings))
        again_s = max(0.0, reference.wall_s + candidate.wall_s - 2 * self.typical_probe_s())  # their own cost
        if (median >= 1 + RECHECK_GAIN and low <= 1.0 and pair not in self._rechecked
                and self.affordable(2, extra_s=again_s)):
            self._rechecked.add(pair)
            self.run(candidate.settings, "recheck", reuse=False)
            self.run(reference.settings, "recheck", reuse=False)
            median, low, _ = self.gain(reference, candidate)
        return median >= 1 + MIN_GAIN and low > 1.0

    def describe_gain(self, reference: ProbeResult, candidate: ProbeResult) -> str:
        median, low, high = self.gain(reference, candidate)
        if median != median:
            return f"{candidate.status.value}"
        return f"{median:.2f}x [{low:.2f}, {high:.2f}] over {reference.id}"

    def _record(self, result: ProbeResult) -> None:
        self.probes.append(result)
        if self.on_probe:
            self.on_probe(result)


def _plain_wall(probe: ProbeResult) -> float:
    """A probe's wall time without the profiler's extra steps: only designated probes are profiled, so this is
    what other probes of those settings take."""
    return max(0.0, probe.wall_s - (probe.extra.get("profile_wall_s") or 0.0))


def _key(settings: dict[str, Any]) -> tuple:
    return tuple(sorted(settings.items()))


def confirm(session: Session, base: ProbeResult, winner: ProbeResult,
            notes: list[str]) -> tuple[ProbeResult, dict[str, Any] | None]:
    """Re-measure baseline and winner interleaved (A B A B): drift hits both alike. Returns (recommended, speedup).

    The winner stays recommended only if this interleaved measurement shows a gain beyond the noise too.
    """
    a_runs, b_runs = [], []
    for _ in range(CONFIRM_ROUNDS):
        a_runs.append(session.run(base.settings, "confirm:baseline", reuse=False))
        b_runs.append(session.run(winner.settings, "confirm:recommended", reuse=False))
    failed = [r for r in a_runs + b_runs if not r.ok]
    if failed:
        notes.append(f"confirmation probe {failed[0].id} failed ({failed[0].status.value}: {failed[0].error}); "
                     "keeping the baseline")
        return base, None
    pooled = [[x for r in runs for x in getattr(r, attr)] for runs in (a_runs, b_runs) for attr in ("items", "step_s")]
    median, low, high = stats.ratio_ci(*pooled, waves=(base.wave, winner.wave))
    speedup = {"median": median, "ci_low": low, "ci_high": high,
               "method": f"baseline and recommended re-measured interleaved, {CONFIRM_ROUNDS} rounds",
               "probes": [r.id for pair in zip(a_runs, b_runs) for r in pair]}
    if not (median >= 1 + MIN_GAIN and low > 1.0):
        notes.append(f"the confirmation measured {median:.2f}x [{low:.2f}, {high:.2f}] for "
                     f"{knobs.describe(winner.settings, base.settings)}: within noise, so the baseline "
                     "stays recommended")
        return base, speedup
    return winner, speedup


class Planner:
    """What every strategy shares: the baseline first, the confirmation last, the Outcome."""

    strategy = ""

    def __init__(self, ctx: PlanContext, session: Session):
        self.ctx, self.session = ctx, session
        self.notes: list[str] = []
        self.decisions: list[str] = []
        self.frontier: dict[str, Any] | None = None
        self.loss_changed: dict[tuple, str] = {}  # numeric knob values found to change the loss -> why

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
            found = (parity.compare(reference.raw.get("loss", []), result.raw.get("loss", []))
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
        recommended, speedup = confirm(self.session, base, winner, self.notes)
        return self.outcome(base, recommended, speedup)

    def search(self, base: ProbeResult) -> ProbeResult:
        """The strategy: probes after the baseline; returns the fastest configuration found."""
        raise NotImplementedError

    def outcome(self, base: ProbeResult, recommended: ProbeResult, speedup: dict[str, Any] | None) -> Outcome:
        s = self.session
        return Outcome(self.strategy, base, recommended, speedup, s.probes, s.unexplored, self.notes,
                       self.decisions, self.frontier)
