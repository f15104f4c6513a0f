"""When a training step ends: the host's clock on a CPU, the GPU's own (CUDA events) on a GPU.

A CUDA step returns to the host before the GPU has run it. Synchronising after every step (or reading its loss
with .item()) times it exactly, but it also stops the host from fetching and enqueueing the next batch while the
GPU computes: the overlap that pin_memory with non_blocking copies buys would be measured away. So a GPU probe
records CUDA events on the stream (copy start, copy end, step end) and reads a step's times and loss LAG steps
later, when the GPU has run it: the host runs at most LAG steps ahead, as a loop that logs its loss every few
steps does. A step's time is the GPU timeline from the previous step's end to its own, so a GPU left idle waiting
for data counts.

A lockstep side (probe/lockstep.py) keeps one step in flight (lag 1): it hands the baton back once the step before
the last has ended on the GPU, never after a device-wide synchronize. Its step's time starts at an event recorded
when its baton came (`begin`): in stream order that event completes when the previous step has ended, or at once
on an idle GPU, so the partner's turn and the baton's own round trip are not counted, the GPU's idle time while
this side fetches its batch is. Only DDP ranks keep the host clock, synchronised every step: each rank's step
must end before the all-reduce of the next (the planner compares those one after the other).

`cuda` is the torch.cuda module or a fake with `Event(enable_timing=True)` (record, synchronize, elapsed_time)
and `synchronize()`, so tests run this on a CPU (tests/fakes.py FakeCuda).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

LAG = 2  # steps the host may run ahead of the GPU before it waits for one
LOCKSTEP_LAG = 1  # a lockstep side's steps in flight when it hands the baton back
DEVICE, HOST, HOST_SYNCED = "cuda events", "host", "host, synchronised"  # the clocks' names in results.json


@dataclass
class Finished:
    """A step the device has run: its seconds, its copy's seconds on the device (None: host clock) and its loss
    (None: the step had no loss tensor, as in a script that called backward() on none)."""

    step: int
    seconds: float
    copy_s: float | None
    loss: float | None


def _kept(loss):
    """The loss to read later: a tensor detached as float32 (still on the device), a number or None as it is."""
    return loss.detach().float() if hasattr(loss, "detach") else loss


def _value(loss) -> float | None:
    """A loss's value: a tensor's read (waiting for the device), a number as it is (script mode's host clock)."""
    return float(loss.item()) if hasattr(loss, "item") else (None if loss is None else float(loss))


class HostClock:
    """The step ends when the host holds its loss; `.item()` (and, on a GPU, a synchronize) waits for the device."""

    lag = 0

    def __init__(self, cuda: Any = None):
        self.cuda = cuda  # torch.cuda on a GPU: synchronised after each step; None on a CPU
        self.name = HOST if cuda is None else HOST_SYNCED

    def begin(self) -> None:
        pass

    def copy_start(self) -> None:
        pass

    def copy_end(self) -> None:
        pass

    def end(self, step: int, loss, t0: float, sync: bool = True) -> list[Finished]:
        value = _value(_kept(loss))
        if self.cuda is not None:
            self.cuda.synchronize()
        return [Finished(step, time.perf_counter() - t0, None, value)]

    def flush(self) -> list[Finished]:
        return []


class CudaEventClock:
    """Steps timed by CUDA events on the current stream, read `lag` steps late (see the module's docstring);
    `paced`: a lockstep side's, each step timed from the event `begin` records when its baton comes."""

    name = DEVICE

    def __init__(self, cuda: Any, lag: int = LAG, paced: bool = False):
        self.cuda, self.lag, self.paced = cuda, lag, paced
        self.pending: deque = deque()  # (step, begin event, copy start, copy end, end event, loss tensor)
        self._copy: list = []
        self._last_end = None
        self._begin = None  # paced: this step's start, recorded when the baton came

    def begin(self) -> None:
        """A lockstep side's baton has come: its next step's time starts here, on the stream (not before the
        previous step's end, which is still in flight, nor at the partner's turn)."""
        if self.paced:
            self._begin = self._event()

    def _event(self):
        event = self.cuda.Event(enable_timing=True)
        event.record()
        return event

    def copy_start(self) -> None:
        self._copy = [self._event()]

    def copy_end(self) -> None:
        self._copy.append(self._event())

    def end(self, step: int, loss, t0: float, sync: bool = False) -> list[Finished]:
        """Record the step's end; return the steps the GPU has finished by now, all of them when `sync`."""
        end = self._event()
        copy = self._copy if len(self._copy) == 2 else [None, None]
        begin = next(e for e in (self._begin, self._last_end, copy[0], end) if e is not None)
        self.pending.append((step, begin, copy[0], copy[1], end, _kept(loss)))
        self._last_end, self._copy, self._begin = end, [], None
        done = []
        while len(self.pending) > (0 if sync else self.lag):
            done.append(self._finish(self.pending.popleft()))
        return done

    def flush(self) -> list[Finished]:
        """Every step still in flight (the measured window is over)."""
        return [self._finish(self.pending.popleft()) for _ in range(len(self.pending))]

    def _finish(self, entry) -> Finished:
        step, begin, copy_start, copy_end, end, loss = entry
        end.synchronize()
        copy_s = copy_start.elapsed_time(copy_end) / 1000 if copy_start is not None and copy_end is not None else None
        return Finished(step, begin.elapsed_time(end) / 1000, copy_s, _value(loss))


def for_probe(device_type: str, cuda: Any, host_paced: bool, lockstep: bool = False):
    """The clock a probe's steps use: on a GPU, CUDA events (`lockstep`: a lockstep side's, one step in flight,
    each timed from its baton), unless the steps are paced by others' host clocks (`host_paced`: DDP ranks), which
    need each step over before the next; the host clock otherwise."""
    if device_type != "cuda":
        return HostClock()
    if host_paced:
        return HostClock(cuda)
    return CudaEventClock(cuda, LOCKSTEP_LAG, paced=True) if lockstep else CudaEventClock(cuda)


def overlap(host_copy_s: list[float], device_copy_s: list[float | None]) -> dict[str, Any] | None:
    """How much of the host-to-device copies the host did not wait for: 1 - host time in the copy call / the
    copy's time on the device, over the measured steps (pinned memory and non_blocking: near 1; pageable memory:
    the host waits for a staging copy, near 0). None without device copy times."""
    pairs = [(h, d) for h, d in zip(host_copy_s, device_copy_s) if d is not None and d > 0]
    if not pairs:
        return None
    device = sum(d for _, d in pairs)
    host = sum(min(h, d) for h, d in pairs)
    return {"device_copy_s": device / len(pairs), "host_wait_s": host / len(pairs),
            "overlap_frac": 1 - host / device}
