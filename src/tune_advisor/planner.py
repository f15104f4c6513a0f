"""Which probes to run, in what order, within the budget — the first planner (SPEC §5, simplified).

baseline -> each applicable knob alone -> batch-size ladder -> num_workers ladder -> greedy combination of what
helped -> knobs that pay only with a partner (channels_last with AMP) -> confirmation (baseline and winner
re-measured interleaved). It talks to the world through `Session.run`,
a callable from settings to a ProbeResult, so tests drive it with a fake runner in milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import knobs
from .analysis import stats
from .probe.result import ProbeResult, Status

MIN_GAIN = 0.03  # a change must beat its reference by 3% (and its ratio CI must exclude 1) to be kept
PLATEAU_PATIENCE = 2  # ladder steps in a row without a MIN_GAIN improvement before a ladder stops
DEFAULT_MAX_BATCH = 4096
CONFIRM_ROUNDS = 2  # A B A B
MEMORY_BUDGET_FRACTION = 0.8  # stop growing the batch past this share of the memory available at start
SINGLE_KNOBS = ("amp", "channels_last", "cudnn_benchmark", "pin_memory", "checkpointing")
# Knobs whose gain shows only together with another: channels_last pays mostly under reduced precision, where the
# convolution kernels are NHWC-native. Tried once more on top of a winner that has the partner on.
PARTNERS = {"channels_last": "amp"}


@dataclass
class PlanContext:
    baseline: dict[str, Any]  # every knob
    search: dict[str, list]  # the workload's SEARCH
    workload: knobs.WorkloadFacts
    device: knobs.DeviceFacts
    memory_budget_bytes: int | None = None


@dataclass
class Outcome:
    baseline: ProbeResult
    recommended: ProbeResult
    speedup: dict[str, Any] | None
    probes: list[ProbeResult]
    unexplored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


Runner = Callable[[str, dict[str, Any], str], ProbeResult]  # (probe id, settings, role) -> result


class Session:
    """Runs probes through `runner`, numbers them, reuses identical settings, and keeps the budget."""

    def __init__(self, runner: Runner, budget_s: float | None = None,
                 on_probe: Callable[[ProbeResult], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.runner, self.budget_s, self.on_probe, self.clock = runner, budget_s, on_probe, clock
        self.started = clock()
        self.probes: list[ProbeResult] = []
        self.unexplored: list[str] = []
        self._by_settings: dict[tuple, ProbeResult] = {}

    def elapsed(self) -> float:
        return self.clock() - self.started

    def typical_probe_s(self) -> float:
        walls = [p.wall_s for p in self.probes if p.wall_s > 0]
        return stats.median(walls) if walls else 0.0

    def affordable(self, probes: int = 1, reserve: int = 0) -> bool:
        """Whether `probes` more (keeping `reserve` for the confirmation) fit in what is left of the budget."""
        if self.budget_s is None:
            return True
        return self.elapsed() + (probes + reserve) * self.typical_probe_s() <= self.budget_s

    def run(self, settings: dict[str, Any], role: str, reuse: bool = True) -> ProbeResult:
        key = tuple(sorted(settings.items()))
        if reuse and key in self._by_settings:
            return self._by_settings[key]
        result = self.runner(f"p{len(self.probes) + 1:03d}", dict(settings), role)
        result.role = result.role or role
        self.probes.append(result)
        self._by_settings.setdefault(key, result)
        if self.on_probe:
            self.on_probe(result)
        return result

    def skip(self, settings: dict[str, Any], role: str, reason: str) -> ProbeResult:
        """Record a probe that was not run (not applicable), so the report says why."""
        result = ProbeResult(id=f"p{len(self.probes) + 1:03d}", settings=dict(settings), status=Status.SKIPPED,
                             error=reason, role=role)
        self.probes.append(result)
        if self.on_probe:
            self.on_probe(result)
        return result


def gain(reference: ProbeResult, candidate: ProbeResult) -> tuple[float, float, float]:
    """Throughput ratio candidate/reference: (median, ci_low, ci_high); NaNs when either failed."""
    if not (reference.ok and candidate.ok):
        return float("nan"), float("nan"), float("nan")
    return stats.ratio_ci(reference.items, reference.step_s, candidate.items, candidate.step_s,
                          seed=0)


def beats(reference: ProbeResult, candidate: ProbeResult) -> bool:
    median, low, _ = gain(reference, candidate)
    return median >= 1 + MIN_GAIN and low > 1.0


class FirstPlanner:
    def __init__(self, ctx: PlanContext, session: Session):
        self.ctx, self.session = ctx, session
        self.notes: list[str] = []

    def values(self, name: str) -> list:
        return list(self.ctx.search.get(name, knobs.KNOBS[name].candidates))

    def run(self) -> Outcome:
        s, ctx = self.session, self.ctx
        base = s.run(ctx.baseline, "baseline")
        if not base.ok:
            self.notes.append(f"the baseline probe failed ({base.status.value}): nothing to compare against; "
                              "fix that first")
            return Outcome(base, base, None, s.probes, s.unexplored, self.notes)

        changes: list[tuple[dict[str, Any], ProbeResult]] = []  # single changes that beat the baseline
        for name in SINGLE_KNOBS:
            for value in self.values(name):
                if value == ctx.baseline[name]:
                    continue
                settings = {**ctx.baseline, name: value}
                reason = knobs.not_applicable(name, value, ctx.workload, ctx.device)
                if reason:
                    s.skip(settings, f"knob:{name}", reason)
                    continue
                if not s.affordable(reserve=2 * CONFIRM_ROUNDS):
                    s.unexplored.append(f"{name}={value}: over budget")
                    continue
                result = s.run(settings, f"knob:{name}")
                if beats(base, result):
                    changes.append(({name: value}, result))

        for name, ladder in (("batch_size", self.batch_ladder), ("num_workers", self.worker_ladder)):
            best = ladder(base)
            if best is not None and best is not base and beats(base, best):
                changes.append(({name: best.settings[name]}, best))

        winner = self.combine(base, changes)
        winner = self.retry_partners(base, winner)
        speedup = None
        if winner is not base:
            winner, speedup = self.confirm(base, winner)
        return Outcome(base, winner, speedup, s.probes, s.unexplored, self.notes)

    def _ladder(self, base: ProbeResult, name: str, values: list, stop_on_memory: bool) -> ProbeResult:
        """Probe `values` of knob `name` in order; stop at the first failure or after a plateau. Returns the best."""
        s = self.session
        best, stale = base, 0
        for i, value in enumerate(values):
            if not s.affordable(reserve=2 * CONFIRM_ROUNDS):
                s.unexplored.extend(f"{name}={v}: over budget" for v in values[i:])
                break
            result = s.run({**base.settings, name: value}, f"ladder:{name}")
            if not result.ok:
                self.notes.append(f"{name} ladder stopped at {name}={value}: {result.status.value}")
                break
            if beats(best, result):
                best, stale = result, 0
            else:
                stale += 1
                if stale >= PLATEAU_PATIENCE:
                    s.unexplored.extend(f"{name}={v}: past the throughput plateau" for v in values[i + 1:])
                    break
            budget = self.ctx.memory_budget_bytes
            if stop_on_memory and budget and (result.peak_memory_bytes or 0) > budget:
                self.notes.append(f"{name} ladder stopped at {name}={value}: peak memory "
                                  f"{result.peak_memory_bytes / 2**30:.1f} GiB is over the memory budget")
                break
        return best

    def batch_ladder(self, base: ProbeResult) -> ProbeResult | None:
        start = base.settings["batch_size"]
        if "batch_size" in self.ctx.search:
            values = sorted(v for v in self.ctx.search["batch_size"] if v > start)
        else:
            bound = min(DEFAULT_MAX_BATCH, self.ctx.workload.dataset_len or DEFAULT_MAX_BATCH)
            values, v = [], start * 2
            while v <= bound:
                values.append(v)
                v *= 2
        return self._ladder(base, "batch_size", values, stop_on_memory=True) if values else None

    def worker_ladder(self, base: ProbeResult) -> ProbeResult | None:
        start = base.settings["num_workers"]
        values = sorted(v for v in self.values("num_workers") if v > start)
        return self._ladder(base, "num_workers", values, stop_on_memory=False) if values else None

    def combine(self, base: ProbeResult, changes: list[tuple[dict[str, Any], ProbeResult]]) -> ProbeResult:
        """Greedy: add single changes in order of their own gain; keep each only if it beats the current best."""
        s = self.session
        changes = sorted(changes, key=lambda c: -gain(base, c[1])[0])
        if not changes:
            return base
        current = changes[0][1]
        for change, _ in changes[1:]:
            if not s.affordable(reserve=2 * CONFIRM_ROUNDS):
                s.unexplored.append(f"combination with {knobs.describe(change)}: over budget")
                continue
            candidate = s.run({**current.settings, **change}, "combine")
            if candidate.ok and beats(current, candidate):
                current = candidate
            elif not candidate.ok:
                self.notes.append(f"{knobs.describe(candidate.settings, base.settings)} failed together "
                                  f"({candidate.status.value}) though each part worked alone")
        return current

    def retry_partners(self, base: ProbeResult, winner: ProbeResult) -> ProbeResult:
        """Give a knob that did not pay alone one more probe on top of a winner that has its partner on."""
        s, ctx = self.session, self.ctx
        for name, partner in PARTNERS.items():
            if winner.settings[partner] == knobs.KNOBS[partner].default:
                continue
            for value in self.values(name):
                if value == winner.settings[name] or knobs.not_applicable(name, value, ctx.workload, ctx.device):
                    continue
                if not s.affordable(reserve=2 * CONFIRM_ROUNDS):
                    s.unexplored.append(f"{name}={value} with {partner}: over budget")
                    continue
                candidate = s.run({**winner.settings, name: value}, "combine")
                if candidate.ok and beats(winner, candidate):
                    winner = candidate
        return winner

    def confirm(self, base: ProbeResult, winner: ProbeResult) -> tuple[ProbeResult, dict[str, Any] | None]:
        """Re-measure baseline and winner interleaved (A B A B): drift hits both alike. Returns (recommended, speedup)."""
        s = self.session
        a_runs, b_runs = [], []
        for _ in range(CONFIRM_ROUNDS):
            a_runs.append(s.run(base.settings, "confirm:baseline", reuse=False))
            b_runs.append(s.run(winner.settings, "confirm:recommended", reuse=False))
        if not all(r.ok for r in a_runs + b_runs):
            failed = next(r for r in a_runs + b_runs if not r.ok)
            self.notes.append(f"confirmation probe {failed.id} failed ({failed.status.value}: {failed.error}); "
                              "keeping the baseline")
            return base, None
        a_items = [x for r in a_runs for x in r.items]
        a_times = [x for r in a_runs for x in r.step_s]
        b_items = [x for r in b_runs for x in r.items]
        b_times = [x for r in b_runs for x in r.step_s]
        median, low, high = stats.ratio_ci(a_items, a_times, b_items, b_times)
        speedup = {"median": median, "ci_low": low, "ci_high": high,
                   "method": f"baseline and recommended re-measured interleaved, {CONFIRM_ROUNDS} rounds",
                   "probes": [r.id for pair in zip(a_runs, b_runs) for r in pair]}
        if not (median >= 1 + MIN_GAIN and low > 1.0):
            self.notes.append(f"the confirmation measured {median:.2f}x [{low:.2f}, {high:.2f}] for "
                              f"{knobs.describe(winner.settings, base.settings)}: within noise, so the baseline "
                              "stays recommended")
            return base, speedup
        return winner, speedup
