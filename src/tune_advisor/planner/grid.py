"""`--strategy grid`: every combination of the SEARCH values, for users who want them all and as the yardstick
the adaptive planner is benchmarked against (benchmarks/search_quality.py)."""

from __future__ import annotations

import itertools
import math
from typing import Any

from .. import knobs
from ..probe.result import ProbeResult
from . import compare
from .base import PlanContext, Planner


def combinations(ctx: PlanContext) -> list[dict[str, Any]]:
    """The full factorial of SEARCH over the baseline (knobs SEARCH does not name keep their baseline value)."""
    names = list(ctx.search)
    return [{**ctx.baseline, **dict(zip(names, values))}
            for values in itertools.product(*(ctx.search[name] for name in names))]


def not_applicable(ctx: PlanContext, settings: dict[str, Any]) -> str | None:
    """Why a combination cannot run here: a value SEARCH gives it that does not apply. A knob at the baseline's own
    value is never the reason (a Trainer's default dataloader_pin_memory=True on a CPU): the baseline ran with it,
    and a probe applies such a value only where it can (probe/apply.py), as the adaptive planner assumes."""
    for name, value in settings.items():
        if value == ctx.baseline.get(name):
            continue
        reason = knobs.not_applicable(name, value, ctx.workload, ctx.device, settings)
        if reason:
            return f"{knobs.describe({name: value})}: {reason}"
    return None


class GridPlanner(Planner):
    strategy = "grid"

    def search(self, base: ProbeResult) -> ProbeResult:
        s, ctx = self.session, self.ctx
        grid = combinations(ctx)
        self.decisions.append(f"grid of {len(grid)} combinations of {', '.join(ctx.search) or 'nothing'}")
        if s.backend.width > 1:  # --executor ray: the combinations are independent, so all go out at once
            self.fan_out(grid)
            grid = []  # nothing left for the one-at-a-time loop
        for i, settings in enumerate(grid):
            reason = not_applicable(ctx, settings)
            if reason:
                s.skip(settings, "grid", reason)
                continue
            if not s.budget.affordable():
                s.ledger.unexplored.extend(f"{knobs.describe(g, ctx.baseline)}: over budget" for g in grid[i:]
                                           if not not_applicable(ctx, g))
                break
            s.run(settings, "grid")
        # Settings whose numeric knobs changed the loss, whose compile time the stated run does not repay, or whose
        # compile mode compiled no graph, are not candidates, however fast (notes and decisions say which).
        eligible = [p for p in s.ledger.probes if p.ok and not self.changes_loss(p) and not self.compile_unpaid(p)
                    and not self._eager(p)]
        winner = max(eligible or [base], key=lambda p: p.throughput_median)
        self.decisions.append(f"fastest: {knobs.describe(winner.settings, ctx.baseline)} "
                              f"({compare.describe_gain(s.ledger, base, winner)})")
        return winner

    def _eager(self, result: ProbeResult) -> bool:
        """Whether `result` ran eagerly under a compile mode (`ran_eagerly`); the first such probe of each mode
        is named in the decisions."""
        why = self.ran_eagerly(result)
        if why is not None and not any(d.startswith(f"compile={result.settings['compile']}: not a candidate")
                                       for d in self.decisions):
            self.decisions.append(f"compile={result.settings['compile']}: not a candidate: {why} ({result.id})")
        return why is not None

    def fan_out(self, grid: list[dict[str, Any]]) -> None:
        """Every applicable combination at once, as many as the budget allows with `backend.width` side by side."""
        s, ctx = self.session, self.ctx
        todo = []
        for settings in grid:
            reason = not_applicable(ctx, settings)
            if reason:
                s.skip(settings, "grid", reason)
            elif s.ledger.seen(settings) is None:
                todo.append(settings)
        fits = len(todo)
        while fits and not s.budget.affordable(math.ceil(fits / max(1, s.backend.width))):
            fits -= 1
        s.ledger.unexplored.extend(f"{knobs.describe(g, ctx.baseline)}: over budget" for g in todo[fits:])
        s.run_many(todo[:fits], "grid")
