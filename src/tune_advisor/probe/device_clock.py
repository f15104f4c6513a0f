"""When a training step ends: the host's clock on a CPU, the GPU's own (CUDA events) on a GPU.

A CUDA step returns to the host before the GPU has run it. Synchronising after every step (or reading its loss
with .item()) times it exactly, but it also stops the host from fetching and enqueueing the next batch while the
GPU computes: the overlap that pin_memory with non_blocking copies buys would be measured away. So a GPU probe
records CUDA events on the stream (copy start, copy end, step end) and reads a step's times and loss LAG steps
later, when the GPU has run it: the host runs at most LAG steps ahead, as a loop that logs its loss every few
steps does. A step's time is the GPU timeline from the previous step's end to its own, so a GPU left idle waiting
for data counts. Lockstep pairs and DDP ranks keep the host clock: their steps must end before the partner's or
the other ranks' next one.

`cuda` is the torch.cuda module or a fake with `Event(enable_timing=True)` (record, synchronize, elapsed_time)
and `synchronize()`, so tests run this on a CPU.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

LAG = 2  # steps the host may run ahead of the GPU before it waits for one


@dataclass
class Finished:
    """A step the device has run: its seconds, its copy's seconds on the device (None: host clock) and its loss."""

    step: int
    seconds: float
    copy_s: float | None
    loss: float


class HostClock:
    """The step ends when the host holds its loss; `.item()` (and, on a GPU, a synchronize) waits for the device."""

    lag = 0

    def __init__(self, cuda: Any = None):
        self.cuda = cuda  # torch.cuda on a GPU: synchronised after each step; None on a CPU

    def copy_start(self) -> None:
        pass

    def copy_end(self) -> None:
        pass

    def end(self, step: int, loss, t0: float, sync: bool = True) -> list[Finished]:
        value = loss.detach().float().item()
        if self.cuda is not None:
            self.cuda.synchronize()
        return [Finished(step, time.perf_counter() - t0, None, value)]

    def flush(self) -> list[Finished]:
        return []


class CudaEventClock:
    """Steps timed by CUDA events on the current stream, read LAG steps late (see the module's docstring)."""

    def __init__(self, cuda: Any, lag: int = LAG):
        self.cuda, self.lag = cuda, lag
        self.pending: deque = deque()  # (step, begin event, copy start, copy end, end event, loss tensor)
        self._copy: list = []
        self._last_end = None

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
        begin = self._last_end if self._last_end is not None else copy[0] or end
        self.pending.append((step, begin, copy[0], copy[1], end, loss.detach().float()))
        self._last_end, self._copy = end, []
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
        return Finished(step, begin.elapsed_time(end) / 1000, copy_s, float(loss.item()))


def for_probe(device_type: str, cuda: Any, host_paced: bool):
    """The clock a probe's steps use: CUDA events on a GPU, unless the steps are paced by others (`host_paced`:
    a lockstep partner, DDP ranks), which need each step over before the next; the host clock otherwise."""
    if device_type != "cuda":
        return HostClock()
    return HostClock(cuda) if host_paced else CudaEventClock(cuda)


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
