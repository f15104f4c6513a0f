"""When a probe stops measuring: a free-running child's stopping rule, and the window rule it shares with a
lockstep pair (probe/lockstep.py). Imports only leaves: analysis.stats, probe.spec."""

from __future__ import annotations

import math
from typing import Sequence

from ..analysis.stats import period, wave_noise
from .spec import Protocol

MIN_WAVES_AT_CAP = 25  # the measured-step cap is at least this many loader waves
# Once the protocol's minimum is reached, the window's noise is judged again only after it has grown by this
# factor: a judgement costs time in proportion to the steps (0.1-0.2 ms at 1,000-5,000), and judged after every
# step it slowed the loop it measured (tiny_scheduled's 2 ms steps read 15% slow over a 5,000-step window).
NOISE_RECHECK = 1.05

# A window of loader-fed steps is rounded up to whole epochs when that costs at most this factor of the caps.
EPOCH_ROUNDING_CAP = 1.5
# ... and up to this factor in a lockstep pair whose sides' epochs differ (other batch sizes): their epoch starts
# then fall at different steps, and a window short of their common multiple holds one side's share of restarts and
# not the other's. In one augment_cpu duel (3 loader workers, epochs of 64 and 16 steps), 45 steps held none of
# batch 32's restarts (each ~170 ms over a 29 ms step: ~9% of its epoch) and three of batch 128's: the duel read
# 1.05x where whole-epoch probes read ~1.2x. The 64-step window was projected at 1.6x the cap.
PAIR_EPOCH_ROUNDING_CAP = 2.5


class EpochWindow:
    """When a measurement with loader workers stops: at whole epochs, when the next epoch boundary is near.

    Each epoch starts new loader workers (or, persistent, refills their queue), a stall real training pays once
    per epoch. A window of whole epochs holds its share of stalls wherever it starts; a part of one holds one stall
    or none by chance. io_bound's 8-worker probes read ~1,900 samples/s over 32 steps without an epoch start, and
    ~1,430 over 177 steps with three (64-step epochs). So once the protocol is met after `n` steps, measuring goes
    on to the next whole epoch if that is projected within EPOCH_ROUNDING_CAP times the step and time caps, and
    stops there (or at that time cap, should the steps slow down). A lockstep pair (probe/lockstep.py) applies it
    to the least common multiple of its two sides' epochs. `epoch_steps` None: no loader workers, or no length."""

    def __init__(self, epoch_steps: int | None, max_steps: int, max_time_s: float, wave: int = 1,
                 rounding_cap: float = EPOCH_ROUNDING_CAP):
        self.epoch_steps, self.max_steps, self.max_time_s = epoch_steps, max_steps, max_time_s
        self.wave = max(1, wave)
        self.rounding_cap = rounding_cap
        self.target: int | None = None  # the step count to stop at, fixed once the protocol is first met

    def done(self, met: bool, n: int, elapsed: float) -> bool:
        """Whether to stop after `n` steps in `elapsed` seconds, given whether the protocol is `met`.

        Short of whole epochs, the window still ends on whole loader waves: in steady state each wave of
        `wave` steps holds one wait for the next batch, so a window that ends mid-wave holds one wait too many
        or too few (2 workers, 13 steps: 7 waits for 6.5 waves' batches, 8% under the steady rate)."""
        if self.target is None:
            if not met:
                return False
            self.target = self._rounded(n, self.wave, elapsed)
            if self.epoch_steps and n % self.epoch_steps:
                self.target = max(self.target, self._rounded(n, self.epoch_steps, elapsed))
        return n >= self.target or elapsed >= self.rounding_cap * self.max_time_s

    def _rounded(self, n: int, unit: int, elapsed: float) -> int:
        """`n` rounded up to whole `unit`s if that is projected within the caps (times EPOCH_ROUNDING_CAP)."""
        whole = -(-n // unit) * unit
        fits = (whole <= self.rounding_cap * self.max_steps
                and elapsed * whole / n <= self.rounding_cap * self.max_time_s)
        return whole if fits else n


def step_cap(max_steps: int, workers: int) -> int:
    """The measured-step cap: the protocol's, or MIN_WAVES_AT_CAP loader waves of `workers` steps if more.

    The noise of a loader-fed step is judged over waves of num_workers steps (analysis.stats.wave_noise), so the
    cap is counted in waves too: a busy loader gets as many waves to settle as a single process gets steps."""
    return max(max_steps, MIN_WAVES_AT_CAP * workers)


class StopRule:
    """When a free-running child stops measuring: at a cap (steps or time), or once the protocol is met (min steps,
    min time, wave noise at most the bar), then rounded to whole loader waves (and accumulation cycles of `cycle`
    steps) or epochs by an EpochWindow."""

    def __init__(self, protocol: Protocol, workers: int, epoch_steps: int | None, cycle: int = 1):
        self.protocol, self.period = protocol, period(workers, cycle)  # the steps after which the series repeats
        self.max_steps = step_cap(protocol.max_steps, workers)
        self.window = EpochWindow(epoch_steps, self.max_steps, protocol.max_time_s, wave=self.period)
        self.noise_due = 0  # the steps from which the noise is judged next (NOISE_RECHECK)

    def met(self, step_s: Sequence[float], elapsed: float) -> bool:
        """Whether a cap is reached or the protocol met after the steps `step_s`, `elapsed` seconds in."""
        n, proto = len(step_s), self.protocol
        if n >= self.max_steps or elapsed >= proto.max_time_s:
            return True
        if n < max(proto.min_steps, self.noise_due) or elapsed < proto.min_time_s:
            return False
        self.noise_due = max(n + 1, math.ceil(n * NOISE_RECHECK))
        return wave_noise(step_s, self.period) <= proto.noise_bar

    def done(self, step_s: Sequence[float], elapsed: float) -> bool:
        """Whether to stop after the measured steps `step_s`, `elapsed` seconds after the first began."""
        return self.window.done(self.met(step_s, elapsed), len(step_s), elapsed)
