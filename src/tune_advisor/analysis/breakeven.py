"""Whether torch.compile's one-off compile time pays for itself within the training run the user states
(`--train-steps`): the planner keeps compile only where it does (planner/base.py `compile_unpaid`, and skips it
untried where even its best case could not: planner/adaptive.py), and TA504 says which."""

from __future__ import annotations

import math

# The least a compile takes, for judging one not yet measured: a small model took 5-60 s on a 2-core CPU (the C++
# compiler runs for every kernel); on a GPU seconds to minutes.
COMPILE_MIN_S = 5.0


def run_steps(train_steps: int, base_batch: int, batch: int) -> float:
    """The user's run, `train_steps` steps at the baseline's batch, in steps of `batch`: the same samples."""
    return train_steps * base_batch / batch


def break_even_steps(compile_s: float, step_off_s: float, step_on_s: float) -> float:
    """Steps at the compiled speed until `compile_s` is earned back; inf where compiling saves nothing a step."""
    saving = step_off_s - step_on_s
    return compile_s / saving if saving > 0 else math.inf


def most_saved_s(steps: float, step_s: float, speedup: float) -> float:
    """What `steps` steps of `step_s` seconds save at most at `speedup`."""
    return steps * step_s * (1 - 1 / speedup)


def verdict(break_even: float, run: float) -> str:
    """The break-even against the user's run, as the planner's notes and TA504 word it."""
    return (f"within the {run:,.0f} steps of the run --train-steps states" if break_even <= run else
            f"past the {run:,.0f} steps of the run --train-steps states")
