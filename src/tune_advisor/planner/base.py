"""What every strategy shares: the plan's inputs (PlanContext), its result (Outcome), and the Planner that runs
the baseline first and the ablation and confirmation last."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from .. import knobs
from ..analysis import breakeven, parity
from ..probe.result import ProbeResult, Status
from . import ablation, compile_cost
from .confirm import confirm
from .session import Session


@dataclass
class PlanContext:
    baseline: dict[str, Any]  # every knob
    search: dict[str, list]  # the workload's SEARCH
    workload: knobs.WorkloadFacts
    device: knobs.DeviceFacts
    memory_budget_bytes: int | None = None
    # What --memory-margin is kept free of (--max-memory, else the GPU's memory; None: no margin, a CPU without
    # --max-memory), and the margin: a batch whose peak leaves less free is not recommended (adaptive._over_memory)
    memory_capacity_bytes: int | None = None
    memory_margin_bytes: int = 0
    explore: tuple[str, ...] | None = None  # --knobs: the only knobs the adaptive planner explores; None: all
    # --train-steps: the user's training run, in steps at the baseline's batch; compile is recommended only where its
    # compile time pays off within it (analysis/breakeven.py). None: not stated, compile judged by its speed alone.
    train_steps: int | None = None
    # The workload file's sha256, where this machine's record of earlier compiles applies (planner/compile_cost.py);
    # None: a compile probe is reckoned at the guess.
    workload_sha256: str | None = None


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
    unconfirmed: dict[str, Any] | None = None  # the winner the confirmation could not tell (confirm.unconfirmed)

    def plan_summary(self) -> dict[str, Any]:
        """The `plan` object of results.json."""
        return {"strategy": self.strategy, "decisions": list(self.decisions), "frontier": self.frontier,
                "ablation": list(self.ablation)}


class Planner:
    """What every strategy shares: the baseline first, the confirmation last, the Outcome."""

    strategy = ""

    def __init__(self, ctx: PlanContext, session: Session):
        self.ctx, self.session = ctx, session
        self.notes: list[str] = []
        self.decisions: list[str] = []
        self.frontier: dict[str, Any] | None = None
        self.loss_changed: dict[tuple, str] = {}  # numeric knob values found to change the loss -> why
        self.unpaid: dict[str, str] = {}  # compile modes whose compile time the stated run does not repay -> why
        self.ablation: list[dict[str, Any]] = []  # each changed knob's measured contribution (planner/ablation.py)
        self.unconfirmed: dict[str, Any] | None = None  # the winner the confirmation could not tell from the noise

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
            reference = self.session.ledger.seen(parity.reference_settings(result.settings))
            # At the same global steps: a compiled probe warms up longer, so its measured steps start later.
            found = (parity.compare_probes(reference, result)
                     if reference is not None and reference.ok else None)
            if found is not None and not found.ok:
                self.loss_changed[key] = parity.describe(changes, found) + f" ({reference.id} vs {result.id})"
                self.notes.append(self.loss_changed[key] + ": not recommended, whatever its speed")
        return parity.barred(result.settings, self.loss_changed)

    def compile_unpaid(self, result: ProbeResult) -> str | None:
        """Why `result`'s compile mode must not be recommended: its compile time, against its twin without compile,
        pays off only past the run --train-steps states (`ctx.train_steps`); None where it pays off within it, or
        where that is not known (no run stated, no twin measured). As a loss change, one verdict bars the mode
        everywhere: its compile time is the same at other settings, which have no twin to judge by."""
        mode, steps = result.settings.get("compile", "off"), self.ctx.train_steps
        if not steps or mode == "off" or not result.ok:
            return None
        if mode not in self.unpaid:
            twin = self.session.ledger.seen({**result.settings, "compile": "off"})
            compile_s = compile_cost.compile_s(result)
            if twin is None or not twin.ok or not twin.step_s or not result.step_s or compile_s is None:
                return None
            run = breakeven.run_steps(steps, self.ctx.baseline["batch_size"], result.settings["batch_size"])
            even = breakeven.break_even_steps(compile_s, statistics.median(twin.step_s),
                                              statistics.median(result.step_s))
            if even <= run:
                return None
            self.unpaid[mode] = (
                f"compile={mode}: its {compile_s:.0f} s of compiling pays off after about {even:,.0f} steps "
                f"({twin.id} vs {result.id}), {breakeven.verdict(even, run)}" if even != math.inf else
                f"compile={mode}: its steps were no faster than without it ({twin.id} vs {result.id}), so its "
                f"{compile_s:.0f} s of compiling never pays off")
            self.notes.append(self.unpaid[mode] + ": not recommended")
        return self.unpaid[mode]

    @staticmethod
    def ran_eagerly(result: ProbeResult) -> str | None:
        """Why a compiled probe ran eagerly (dynamo compiled no graph), else None: its speed is the eager model's,
        and any gain it reads is the processes' spread. A 2-minute lstm_collate run kept compile=default at 1.09x
        over eager, every one of its compiled probes having compiled no graph ("Attempted to wrap RNN, GRU, or
        LSTM"), and its report's TA504 advised leaving compile off. Neither strategy recommends such a probe."""
        stats = result.extra.get("compile") if result.ok else None
        if not stats or stats.get("graphs", 1) != 0:
            return None
        why = "; ".join(stats.get("unsupported") or []) or "dynamo gave up on the model"
        return f"compile={result.settings['compile']} compiled no graph ({why}), so the model ran eagerly"

    def run(self) -> Outcome:
        base = self.session.run(self.ctx.baseline, "baseline")
        self.session.ledger.start_from(base)
        if not base.ok:
            self.notes.append(
                f"the baseline probe did not finish ({base.error}): nothing to compare against; give the run a "
                "longer --budget" if base.status is Status.STOPPED else  # the budget cut it short: not a failure
                f"the baseline probe failed ({base.status.value}): nothing to compare against; fix that first")
            return self.outcome(base, base, None)
        winner = self.search(base)
        if winner is base or winner.settings == base.settings:
            return self.outcome(base, base, None)
        self.session.ledger.keep_best(winner)
        winner, self.ablation = ablation.ablate(self.session, base, winner, self.notes, self.decisions)
        if winner.settings == base.settings:
            return self.outcome(base, base, None)
        recommended, speedup, self.unconfirmed = confirm(self.session, base, winner, self.notes)
        return self.outcome(base, recommended, speedup)

    def search(self, base: ProbeResult) -> ProbeResult:
        """The strategy: probes after the baseline; returns the fastest configuration found."""
        raise NotImplementedError

    def outcome(self, base: ProbeResult, recommended: ProbeResult, speedup: dict[str, Any] | None) -> Outcome:
        ledger = self.session.ledger
        return Outcome(self.strategy, base, recommended, speedup, ledger.probes, ledger.unexplored, self.notes,
                       self.decisions, self.frontier, self.ablation, self.unconfirmed)
