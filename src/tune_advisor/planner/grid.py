"""`--strategy grid`: every combination of the SEARCH values, for users who want them all and as the yardstick
the adaptive planner is benchmarked against (benchmarks/search_quality.py)."""

from __future__ import annotations

import itertools
from typing import Any

from .. import knobs
from ..probe.result import ProbeResult
from .session import PlanContext, Planner


def combinations(ctx: PlanContext) -> list[dict[str, Any]]:
    """The full factorial of SEARCH over the baseline (knobs SEARCH does not name keep their baseline value)."""
    names = list(ctx.search)
    return [{**ctx.baseline, **dict(zip(names, values))}
            for values in itertools.product(*(ctx.search[name] for name in names))]


def not_applicable(ctx: PlanContext, settings: dict[str, Any]) -> str | None:
    for name, value in settings.items():
        reason = knobs.not_applicable(name, value, ctx.workload, ctx.device)
        if reason:
            return f"{knobs.describe({name: value})}: {reason}"
    return None


class GridPlanner(Planner):
    strategy = "grid"

    def search(self, base: ProbeResult) -> ProbeResult:
        s, ctx = self.session, self.ctx
        grid = combinations(ctx)
        self.decisions.append(f"grid of {len(grid)} combinations of {', '.join(ctx.search) or 'nothing'}")
        for i, settings in enumerate(grid):
            reason = not_applicable(ctx, settings)
            if reason:
                s.skip(settings, "grid", reason)
                continue
            if not s.affordable():
                s.unexplored.extend(f"{knobs.describe(g, ctx.baseline)}: over budget" for g in grid[i:]
                                    if not not_applicable(ctx, g))
                break
            s.run(settings, "grid")
        winner = max((p for p in s.probes if p.ok), key=lambda p: p.throughput_median)
        self.decisions.append(f"fastest: {knobs.describe(winner.settings, ctx.baseline)} "
                              f"({s.describe_gain(base, winner)})")
        return winner
