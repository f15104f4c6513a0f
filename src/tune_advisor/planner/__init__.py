"""Which probes to run, in what order, within the budget (SPEC §5).

session.py   the probe session (numbering, reuse, budget), the noise-aware comparison, the confirmation
adaptive.py  the default planner: most promising knob first, re-opening the knobs a kept change interacts with
grid.py      `--strategy grid`: the full factorial of SEARCH
"""

from __future__ import annotations

from .adaptive import AdaptivePlanner
from .grid import GridPlanner
from .session import MIN_GAIN, Outcome, PlanContext, Session

STRATEGIES = {"adaptive": AdaptivePlanner, "grid": GridPlanner}


def plan(ctx: PlanContext, session: Session, strategy: str = "adaptive") -> Outcome:
    return STRATEGIES[strategy](ctx, session).run()


__all__ = ["AdaptivePlanner", "GridPlanner", "MIN_GAIN", "Outcome", "PlanContext", "STRATEGIES", "Session", "plan"]
