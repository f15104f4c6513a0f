"""Which probes to run, in what order, within the budget (SPEC §5).

base.py      what every strategy shares: PlanContext in, Outcome out, the Planner's baseline-search-ablate-confirm
session.py   the probe session: what a planner asks to have measured (run, measure, duel, beats), through a backend
ledger.py    the probes of a plan: numbering, reuse, resume replay, samples, duels, wins, keeps, baseline and best
budget.py    the wall-time budget: every time rule, from the analysis's slices to one probe's limits
pairing.py   whether two settings can be measured side by side in lockstep (backend, loaders, memory)
compare.py   the noise-aware comparison, as functions of the ledger: gains, duels, when a gain counts
figures.py   the throughputs a report prints for the baseline and the recommendation
ablation.py  each changed knob measured beside the winner without it
confirm.py   the confirmation: baseline and winner again, in lockstep rounds and alone
keep.py      the keep rule shared by planner and rules (MIN_GAIN), and which settings can run in lockstep
adaptive.py  the default planner: most promising knob first, re-opening the knobs a kept change interacts with
grid.py      `--strategy grid`: the full factorial of SEARCH
"""

from __future__ import annotations

from .adaptive import AdaptivePlanner
from .grid import GridPlanner
from .base import Outcome, PlanContext
from .keep import MIN_GAIN
from .session import Session

STRATEGIES = {"adaptive": AdaptivePlanner, "grid": GridPlanner}


def plan(ctx: PlanContext, session: Session, strategy: str = "adaptive") -> Outcome:
    return STRATEGIES[strategy](ctx, session).run()


__all__ = ["AdaptivePlanner", "GridPlanner", "MIN_GAIN", "Outcome", "PlanContext", "STRATEGIES", "Session", "plan"]
