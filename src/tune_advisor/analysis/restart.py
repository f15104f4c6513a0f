"""What starting loader workers anew at each epoch costs, from a probe's measured steps: the one estimate the
planner ranks `persistent_workers` by and rule TA103 reports.

A new epoch without persistent workers shuts the old workers down and starts new ones, which refill the
prefetch queue (workers x prefetch_factor batches) while the training process computes beside them on the same
cores. The cost shows in the steps from the epoch's first until that queue is refilled, not in the data wait of
the first step alone: on hf_trainer (2 workers, 128 steps an epoch) the first step of an epoch took 0.30 s
more than a typical one while waiting only 0.08 s for its batch, and persistent workers measured 1.15x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class RestartCost:
    excess_s: float  # what one epoch start added, on average, to the steps it slowed
    starts: int  # the epoch starts it was measured at
    share: float  # of the training time: what persistent workers could save at most

    @property
    def bound(self) -> float:
        """The most keeping the workers alive could gain: no epoch start costing anything."""
        return 1 / (1 - self.share) if self.share < 1 else float("inf")


def refill_steps(workers: int, prefetch_factor: int | None) -> int:
    """The steps a new epoch's workers take to refill their queue: the span an epoch start slows."""
    return max(1, workers * (prefetch_factor or 2))


def restart_cost(step_s: Sequence[float], starts: Sequence[int], span: int,
                 steps_per_epoch: int | None = None) -> RestartCost | None:
    """The cost of the epoch starts at step indexes `starts` among the measured `step_s`: each start's `span`
    steps (`refill_steps`; at most half an epoch's steps, or the window's where unknown) beyond as many typical
    steps, the mean of the steps outside every span; its share of an epoch of `steps_per_epoch` steps at the mean
    step, or of the measured window where that is unknown. None where no start was measured or no step lies
    outside the spans."""
    span = max(1, min(span, (steps_per_epoch or len(step_s)) // 2))
    spans = [range(i, min(i + span, len(step_s))) for i in sorted(set(starts)) if 0 <= i < len(step_s)]
    inside = {j for r in spans for j in r}
    outside = [s for j, s in enumerate(step_s) if j not in inside]
    if not spans or not outside:
        return None
    typical = sum(outside) / len(outside)
    excess = max(0.0, sum(sum(step_s[j] for j in r) - len(r) * typical for r in spans) / len(spans))
    mean_step = sum(step_s) / len(step_s)
    if steps_per_epoch:
        share = excess / (steps_per_epoch * mean_step)
    else:
        share = excess * len(spans) / sum(step_s)
    return RestartCost(excess, len(spans), min(share, 1.0))
