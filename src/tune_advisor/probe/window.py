"""When a probe stops measuring: the window rule shared by a free-running child and a lockstep pair (a leaf)."""

from __future__ import annotations

MIN_WAVES_AT_CAP = 25  # the measured-step cap is at least this many loader waves

# A window of loader-fed steps is rounded up to whole epochs when that costs at most this factor of the caps.
EPOCH_ROUNDING_CAP = 1.5


class EpochWindow:
    """When a measurement with loader workers stops: at whole epochs, when the next epoch boundary is near.

    Each epoch starts new loader workers (or, persistent, refills their queue), a stall real training pays once
    per epoch. A window of whole epochs holds its share of stalls wherever it starts; a part of one holds one stall
    or none by chance. io_bound's 8-worker probes read ~1,900 samples/s over 32 steps without an epoch start, and
    ~1,430 over 177 steps with three (64-step epochs). So once the protocol is met after `n` steps, measuring goes
    on to the next whole epoch if that is projected within EPOCH_ROUNDING_CAP times the step and time caps, and
    stops there (or at that time cap, should the steps slow down). A lockstep pair (probe/lockstep.py) applies it
    to the least common multiple of its two sides' epochs. `epoch_steps` None: no loader workers, or no length."""

    def __init__(self, epoch_steps: int | None, max_steps: int, max_time_s: float, wave: int = 1):
        self.epoch_steps, self.max_steps, self.max_time_s = epoch_steps, max_steps, max_time_s
        self.wave = max(1, wave)
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
        return n >= self.target or elapsed >= EPOCH_ROUNDING_CAP * self.max_time_s

    def _rounded(self, n: int, period: int, elapsed: float) -> int:
        """`n` rounded up to whole `period`s if that is projected within the caps (times EPOCH_ROUNDING_CAP)."""
        whole = -(-n // period) * period
        fits = (whole <= EPOCH_ROUNDING_CAP * self.max_steps
                and elapsed * whole / n <= EPOCH_ROUNDING_CAP * self.max_time_s)
        return whole if fits else n
