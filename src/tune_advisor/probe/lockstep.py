"""Lockstep ("baton"): two probe children that take turns, one measured step at a time.

Why: a shared VM switches between speed states about 30% apart that last seconds. Two probes measured one after
the other (a round of the reference, then one of the candidate) often run in different states, so their ratio
carries the machine's mood. Two children that alternate single steps see the same state in every pair of steps.
The gate's interleaved mode (`gate --against REF`) measures each round this way; docs/ci-gating.md has the numbers.

Protocol, over two FIFOs per child in the probe workdir (their paths are `ProbeSpec.lockstep`):
    child -> parent, "done" FIFO:  "ready <epoch steps> <cycle> <in flight>\\n" once its warm-up is over (epoch
                                   steps 0: no loader workers or no known length; cycle: steps per optimizer step;
                                   in flight: steps it leaves running on the GPU, 0 or 1), then a line after each
                                   step: "<step seconds> <items>" of each step that ended since the last line
                                   (items: the step's work, samples or what count_items returns), none where the
                                   step is still in flight
    parent -> child, "go" FIFO:    b"w": begin (start the loader, warm up); b"g": run one measured step; b"l":
                                   run one, the last of this turn (a GPU side answers once it has ended); b"s":
                                   stop (before it began: fail at once; else: collectors, result, exit)
Both sides import and build the workload at once, which is mostly Python (hf_transformer's import of
transformers takes 2 s), then warm up one at a time, the other waiting idle in begin(): two warm-ups at once each
start torch's threads on the same cores, and spinning OpenMP threads then slow both tenfold (lstm_collate's
warm-up steps took 5.9 s instead of 0.3 s). The parent hands the baton A B, B A, A B, ... (A B B A: neither
side always moves first), stops after a whole pair once both sides meet the protocol (min steps, min time, noise)
or one hits its cap, and pauses the waiting side's process group (SIGSTOP) so that its loader workers cannot
prefetch, nor its threads spin, on the other side's turn. It never blocks without a deadline: it sleeps in
select() on the FIFO and both children's pidfds, until the probes' wall-clock limit.

Matched turns (`run_pair(match_turns=True)`, the planner's duels): a turn begins where the partner's left the
caches and the core, a cost paid once per turn. With one step a turn that cost lands on every step, and weighs
more on the side whose steps are shorter: lockstep then reads the longer-step side high. So once each side has
taken MATCH_AFTER single steps, a side whose median step is MATCH_FROM or more times shorter than its partner's
takes the nearest whole number of steps to one of its partner's in each turn, and the two sides' turns last about
as long. Each side's result records its steps per turn (`extra.lockstep.turns`, where any turn held more than one
step), and comparisons pair the two sides turn by turn (`turn_sums`).

Device time (probe/device_clock.py): on a GPU a side times its steps with CUDA events and, inside its turn, hands
the baton back once the step before its last has ended: one step stays in flight, as in a real loop, so the host
fetches and enqueues the next batch (and a pinned, non_blocking copy) while the GPU computes; nothing synchronises
the whole device. The turn's last step (b"l") answers once that step has ended on its own stream: a step left in
flight would run during the partner's turn, the two processes' kernels sharing the GPU, and each side would read
part of the other's work (tests/unit/test_device_lockstep.py shows the ratio collapsing towards 1). Each step's time
starts at an event recorded when its baton came, which completes in stream order after the step before, so neither
the partner's turn nor the baton's round trip counts: the pair's ratio is one of GPU time. A turn's first step has
nothing in flight before it, so a side that keeps steps in flight takes at least DEVICE_TURN_STEPS a turn.

Timed turns (`Protocol.turn_s`, the planner's confirmation where steps lie far apart): after MATCH_AFTER single
steps each side takes the whole number of its steps nearest `turn_s` seconds, so the cost a turn pays is spread over
that long on both sides rather than over one step of the longer side.
"""

from __future__ import annotations

import dataclasses
import math
import os
import select
import signal
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import psutil

from ..analysis.stats import period, wave_noise, wave_sums
from . import runner
from .result import ProbeResult, Status
from .spec import ProbeSpec, Protocol
from .window import EPOCH_ROUNDING_CAP, PAIR_EPOCH_ROUNDING_CAP, EpochWindow, step_cap

BEGIN, GO, LAST, STOP = b"w", b"g", b"l", b"s"
READY = "ready"
POLL_S = 0.25  # liveness checks without pidfds (not Linux >= 5.3)
PARTNER_ENDED = "the other side of the lockstep pair ended first"
# Matched turns (see above). Over 102 lockstep pairs of the planner's duels whose steps were 1.5-2.5x apart
# (search_quality runs of all ten fixtures, Intel Xeon, 2 cores), the longer-step side read 4.4% higher against
# the shorter than the same two settings did in the grid's probes alone (1.0-1.5x apart: 0-2%); a 3% gain decides a
# knob. Measured against runs alone (benchmarks/lockstep_bias.py, 8-16 rounds): varlen_transformer's lean went
# from 11.0% to 0.9% with matched turns; cnn's at 4x (6.4%, 5.9%) and hf_transformer's at 2x (4.3%, 5.6%) stayed.
# benchmarks/results/lockstep_bias.md, "Matched turns in the planner's duels".
MATCH_FROM = 1.5
MATCH_AFTER = 3  # single-step pairs of turns before the two sides' step times are compared
MAX_TURN_STEPS = 16
# A GPU side's turn: its first step starts with nothing in flight (the host fetches its batch on an idle GPU), the
# others keep one in flight, as the user's loop does every step. On the fake timeline of tests/unit/
# test_device_lockstep.py (fetch 8 ms, copy 4, compute 4) pinned memory's 1.5x reads 1.3x in turns of 4, 1.39x in 8.
DEVICE_TURN_STEPS = 8


class LockstepError(RuntimeError):
    """The child lost its parent: no baton within the probe's time limit, or the FIFO's other end is gone."""


# --- the child's side -------------------------------------------------------------------------------------------


class NoBaton:
    """A free-running probe: every step is its own to take."""

    active = False
    idle_s = 0.0
    last = False  # never the last step of a turn: nothing waits for it

    def begin(self, epoch_steps: int | None = None, cycle: int = 1, in_flight: int = 0) -> None:
        pass

    def wait(self) -> bool:
        return True

    def done(self, step_s: float, items: float = 1.0) -> None:
        pass

    def hand_over(self, figures: Sequence[tuple[float, float]]) -> None:
        pass

    def report(self) -> None:
        return None


class Baton:
    """The child's end: `wait()` before each measured step (False: stop measuring), `done(step_s)` after it."""

    active = True

    def __init__(self, paths: dict[str, str], timeout_s: float):
        # The parent opened both FIFOs before starting this process, so non-blocking opens find their other end; a
        # missing end means the parent is gone, and a blocking open would then wait forever.
        try:
            self.go = os.open(paths["go"], os.O_RDONLY | os.O_NONBLOCK)
            self.out = os.open(paths["done"], os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise LockstepError(f"cannot join the gate's lockstep ({exc.strerror}): its parent process is gone")
        os.set_blocking(self.go, True)
        os.set_blocking(self.out, True)
        self.timeout_s = timeout_s
        self.epoch_steps, self.cycle, self.in_flight = 0, 1, 0
        self.last = False  # this step is the last of its turn (b"l"): hand back once it has ended
        self.begun: float | None = None  # begin() returned: this side's turn to warm up
        self.began: float | None = None  # the first wait(): the warm-up is over
        self.ready_wait_s = 0.0  # waiting for the other side's warm-up
        self.waited_s = 0.0  # waiting for the baton between steps
        self.spans: list[list[float]] = []  # (start, end) of each measured step, CLOCK_MONOTONIC as in the parent
        self.busy_s = 0.0

    @property
    def idle_s(self) -> float:
        """Wall time since the warm-up that was the other side's: measuring time = wall time - idle_s."""
        return time.perf_counter() - self.began - self.busy_s if self.began is not None else 0.0

    def begin(self, epoch_steps: int | None = None, cycle: int = 1, in_flight: int = 0) -> None:
        """Wait for this side's turn to warm up (the other side is paused meanwhile, or still building).
        `epoch_steps` (batches per epoch with loader workers), `cycle` (steps per optimizer step, under a
        framework's gradient accumulation) and `in_flight` (steps its clock leaves running on the GPU when it hands
        the baton back inside a turn: probe/device_clock.py) go to the parent with "ready"."""
        self.epoch_steps, self.cycle, self.in_flight = epoch_steps or 0, max(1, cycle), in_flight
        word = self._read()
        if word == STOP:
            raise LockstepError(f"stopped before it began: {PARTNER_ENDED}")
        if word != BEGIN:
            raise LockstepError(f"expected the parent's {BEGIN!r}, got {word!r}")
        self.begun = time.perf_counter()

    def wait(self) -> bool:
        first = self.began is None
        if first:
            self.began = time.perf_counter()
            self._send(f"{READY} {self.epoch_steps} {self.cycle} {self.in_flight}")
        word = self._read()
        now = time.perf_counter()
        if first:
            self.ready_wait_s = now - self.began
        else:  # since the last step: the parent may have paused this process before it got here
            self.waited_s += now - self.spans[-1][1]
        if word in (GO, LAST):
            self.last = word == LAST
            self.spans.append([now, now])
            return True
        if word == STOP:
            return False
        raise LockstepError(f"expected the parent's {GO!r} or {STOP!r}, got {word!r}")

    def done(self, step_s: float, items: float = 1.0) -> None:
        self.hand_over([(step_s, items)])

    def hand_over(self, figures: Sequence[tuple[float, float]]) -> None:
        """The baton back after a step: with the (seconds, items) of each step that ended since the last time,
        none where the step is still in flight (a GPU side's first of a turn)."""
        span = self.spans[-1]
        span[1] = time.perf_counter()
        self.busy_s += span[1] - span[0]
        self._send(" ".join(f"{float(s)!r} {float(n)!r}" for s, n in figures))

    def report(self) -> dict:
        return {"steps": len(self.spans), "waited_s": round(self.waited_s, 6),
                "ready_wait_s": round(self.ready_wait_s, 6),
                "warm_span": [round(t, 6) if t is not None else None for t in (self.begun, self.began)],
                "spans": [[round(a, 6), round(b, 6)] for a, b in self.spans]}

    def _read(self) -> bytes:
        ready, _, _ = select.select([self.go], [], [], self.timeout_s)
        if not ready:
            raise LockstepError(f"no baton from the gate's parent process within {self.timeout_s:g} s")
        word = os.read(self.go, 1)
        if not word:
            raise LockstepError("the gate's parent process closed the lockstep channel")
        return word

    def _send(self, line: str) -> None:
        try:
            os.write(self.out, (line + "\n").encode())  # one short write: atomic on a FIFO
        except BrokenPipeError:
            raise LockstepError("the gate's parent process closed the lockstep channel") from None


def baton(spec: ProbeSpec) -> Baton | NoBaton:
    """The child's baton for `spec`: a real one when the gate runs it in lockstep."""
    return Baton(spec.lockstep, spec.limit_s) if spec.lockstep else NoBaton()


# --- the parent's side ------------------------------------------------------------------------------------------


class _Channel:
    """The parent's ends of one child's two FIFOs."""

    def __init__(self, workdir: Path, probe_id: str):
        self.paths = {"go": str(workdir / f"{probe_id}.go"), "done": str(workdir / f"{probe_id}.done")}
        for path in self.paths.values():
            Path(path).unlink(missing_ok=True)
            os.mkfifo(path, 0o600)
        # O_RDWR (Linux): the open returns at once, and the FIFO never reports EOF or EPIPE to us, whatever the
        # child does; its death is seen through its pidfd instead.
        self.go = os.open(self.paths["go"], os.O_RDWR)
        self.done = os.open(self.paths["done"], os.O_RDWR)
        self.pending = b""

    def close(self) -> None:
        for fd in (self.go, self.done):
            os.close(fd)
        for path in self.paths.values():
            Path(path).unlink(missing_ok=True)


class _Ended(Exception):
    def __init__(self, side: int):
        self.side = side


class _TimedOut(Exception):
    def __init__(self, side: int):
        self.side = side  # the side whose line did not come in time


def _time_out(probes: list[runner.Started], late: int) -> tuple[str, int]:
    """Kill both sides, `late` as timed out (the other waited on it); why the pair stopped, as `_Pair.conduct` says."""
    for side, probe in enumerate(probes):
        probe.kill(timed_out=side == late)
    return f"{probes[late].spec.id} timed out", late


class _Pair:
    """Hands the baton between two started children (runner.Started) and decides when both have measured enough."""

    device = False  # a side keeps a step in flight (its "ready"): turns of DEVICE_TURN_STEPS at least

    def __init__(self, probes: list[runner.Started], channels: list[_Channel], noise: str = "each",
                 match_turns: bool = False):
        self.probes, self.channels, self.noise = probes, channels, noise
        self.reps = [1, 1]  # steps per turn of each side (matched_turns)
        self.turns: list[list[int]] = [[], []]  # steps of each turn each side took
        self.deadline = min(p.deadline for p in probes)
        self.exit_fds = [_pidfd(p.pid) for p in probes]
        protocol = probes[0].spec.protocol
        self.protocol = protocol
        self.match_turns = match_turns or protocol.turn_s is not None
        workers = [int(p.spec.settings.get("num_workers") or 0) for p in probes]
        # Steps per loader wave, as analysis.stats.wave_noise counts; with each side's accumulation cycle from its
        # "ready", the period its step series repeats with.
        self.waves = [max(1, w) for w in workers]
        self.epochs = [0, 0]  # each side's batches per epoch, from its "ready" (0: not known, or no workers)
        self.window = None  # an EpochWindow, once both sides are ready
        self.cap = step_cap(protocol.max_steps, max(workers))  # the cap a free-running child has

    def conduct(self, first: int) -> tuple[str, int | None]:
        """Run the pair; returns why it stopped and the side that made it stop: ("measured", None), ("<id> ended",
        side) (the other side was stopped), ("<id> timed out", side) (both killed)."""
        steps: list[list[float]] = [[], []]
        items: list[list[float]] = [[], []]
        try:
            order = (first, 1 - first)
            for side in order:  # one at a time (see the module's docstring), the first mover first; the other
                os.write(self.channels[side].go, BEGIN)  # waits, idle, in begin()
                word, *counts = self._receive(side).split()
                if word != READY:
                    raise ValueError(f"{self.probes[side].spec.id}: expected {READY!r} from the child")
                epochs, cycle, in_flight = (counts + ["0", "1", "0"][len(counts):])[:3]
                self.epochs[side] = int(epochs) if epochs.isdigit() else 0
                self.waves[side] = period(self.waves[side], int(cycle) if cycle.isdigit() else 1)
                self.device |= in_flight.isdigit() and int(in_flight) > 0
                self._signal(side, signal.SIGSTOP)
            self.reps = device_turns(self.reps) if self.device else self.reps
            while not self._enough(steps, items):
                for side in order:
                    for step_s, work in self._turn(side, self.reps[side]):
                        steps[side].append(step_s)
                        items[side].append(work)
                    self.turns[side].append(self.reps[side])
                order = order[::-1]
        except _Ended as ended:
            for side in (0, 1):
                self._stop(side)
            return f"{self.probes[ended.side].spec.id} ended", ended.side
        except _TimedOut as late:
            return _time_out(self.probes, late.side)
        for side in (0, 1):
            self._stop(side)
        return "measured", None

    def close(self) -> None:
        for fd in self.exit_fds:
            if fd is not None:
                os.close(fd)

    def _turn(self, side: int, steps: int) -> list[tuple[float, float]]:
        """One turn of `side`: `steps` measured steps, each (its seconds, its items)."""
        self._signal(side, signal.SIGCONT)
        done = []
        for i in range(steps):
            os.write(self.channels[side].go, LAST if i == steps - 1 else GO)
            words = self._receive(side).split()
            done += [(float(s), float(n)) for s, n in zip(words[::2], words[1::2])]
        self._signal(side, signal.SIGSTOP)
        return done

    def _stop(self, side: int) -> None:
        self._signal(side, signal.SIGCONT)
        os.write(self.channels[side].go, STOP)  # buffered in the FIFO even if the child has exited

    def _enough(self, steps: list[list[float]], items: list[list[float]] | None = None) -> bool:
        """After a whole pair of turns: stop at a cap, or when both sides meet the protocol (min steps, min time,
        noise); with loader workers, then go on to a whole number of both sides' epochs when that is near, as a
        free-running child does (`window.EpochWindow`). With `match_turns`, the steps per turn are fixed after
        MATCH_AFTER pairs (`matched_turns`), and the window counts turns."""
        n = len(self.turns[0])
        if n == 0:
            return False
        if self.window is None:
            if self.match_turns:
                if n < MATCH_AFTER and not self._capped(steps):
                    return False
                self.reps = matched_turns(steps, self.protocol.turn_s)
                self.reps = device_turns(self.reps, timed=bool(self.protocol.turn_s)) if self.device else self.reps
                if self.protocol.turn_s:  # timed turns end at the time cap: a side of short steps would otherwise
                    # reach the step cap in a turn or two (an H200's 2.4 ms steps: two timed turns, 1.3 s a side)
                    self.cap = max(self.cap, max(self.reps) * math.ceil(self.protocol.max_time_s /
                                                                        self.protocol.turn_s))
            # a side's epochs in turns, where they hold whole turns (with matched turns of the batch ratio, a
            # smaller batch's longer epoch takes as many turns as its partner's)
            known = {e // r for e, r in zip(self.epochs, self.reps) if e and e % r == 0}
            period = math.lcm(*known) if known else None
            rounding = EPOCH_ROUNDING_CAP
            if len(known) > 1:  # epochs that differ need their common multiple, if both sides' steps to it end
                # before the probes' deadline (the budget's end): each side measures up to the cap's multiple
                room = (self.deadline - time.monotonic()) / 2 / self.protocol.max_time_s
                rounding = max(EPOCH_ROUNDING_CAP, min(PAIR_EPOCH_ROUNDING_CAP, room))
            self.window = EpochWindow(period, self.cap // max(self.reps), self.protocol.max_time_s,
                                      wave=self._turn_wave(), rounding_cap=rounding)
        return self.window.done(self._measured_enough(steps, items), n, max(sum(s) for s in steps))

    def _capped(self, steps: list[list[float]]) -> bool:
        """Whether either side reached the step cap or the protocol's time cap."""
        return max(map(len, steps)) >= self.cap or max(sum(s) for s in steps) >= self.protocol.max_time_s

    def _turn_wave(self) -> int:
        """A loader wave in turns: the turns that hold a whole wave of the side that needs the most."""
        return max(-(-wave // reps) for wave, reps in zip(self.waves, self.reps))

    def _measured_enough(self, steps: list[list[float]], items: list[list[float]] | None) -> bool:
        proto = self.protocol
        if self._capped(steps):
            return True
        if min(map(len, steps)) < proto.min_steps or min(sum(s) for s in steps) < proto.min_time_s:
            return False
        if self.noise == "ratio":  # turn by turn: the moments both sides' turns shared cancel
            times = [turn_sums(s, t) for s, t in zip(steps, self.turns)]
            work = [turn_sums(i, t) for i, t in zip(items, self.turns)] if items is not None else None
            return ratio_settled(times[0], times[1], self._turn_wave(), items=work)
        return all(wave_noise(s, wave) <= proto.noise_bar for s, wave in zip(steps, self.waves))

    def _receive(self, side: int) -> str:
        """The next line from `side`; raises _Ended when either child exits, _TimedOut past the deadline."""
        channel = self.channels[side]
        watched = [channel.done, *(fd for fd in self.exit_fds if fd is not None)]
        polling = None in self.exit_fds
        while b"\n" not in channel.pending:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise _TimedOut(side)
            ready, _, _ = select.select(watched, [], [], min(remaining, POLL_S) if polling else remaining)
            for other, probe in enumerate(self.probes):
                fd = self.exit_fds[other]
                if (fd in ready) if fd is not None else not _alive(probe.pid):
                    raise _Ended(other)
            if channel.done in ready:
                channel.pending += os.read(channel.done, 4096)
        line, channel.pending = channel.pending.split(b"\n", 1)
        return line.decode()

    def _signal(self, side: int, sig: int) -> None:
        try:
            os.killpg(self.probes[side].pid, sig)  # the child leads its own process group (loader workers too)
        except (ProcessLookupError, PermissionError):
            pass  # it has exited: _receive reports that


RATIO_PRECISION = 0.04  # duels stop once the 95% CI of the step-time ratio is this narrow, or clear of 1 by this


def ratio_settled(a: Sequence[float], b: Sequence[float], wave: int, precision: float = RATIO_PRECISION,
                  items: Sequence[Sequence[float]] | None = None) -> bool:
    """Whether the ratio of the two sides' step times (per item, given the steps' `items`: batches of tokens
    vary) is known well enough: the 95% CI of its geometric mean over loader waves of `wave` steps is within
    ±`precision`, or wholly more than `precision` away from 1. The moments both sides shared cancel in each
    ratio; what is left is each step's own jitter, which averages out."""
    n_waves = min(len(a), len(b)) // max(1, wave)
    if n_waves < 4:
        return False
    sums = [wave_sums(a, wave, n_waves), wave_sums(b, wave, n_waves)]
    if items is not None:
        sums = [t / np.maximum(wave_sums(n, wave, n_waves), 1e-12) for t, n in zip(sums, items)]
    logs = np.log(sums[1] / sums[0])
    half = 1.96 * logs.std(ddof=1) / np.sqrt(n_waves)
    return bool(half <= np.log1p(precision) or abs(logs.mean()) - half > np.log1p(precision))


def matched_turns(steps: Sequence[Sequence[float]], turn_s: float | None = None) -> list[int]:
    """Steps per turn of each side: one, and for a side whose median step is at least MATCH_FROM times shorter
    than its partner's, the nearest whole number of its steps to one of its partner's (at most MAX_TURN_STEPS).
    `turn_s`: each side instead takes the whole number of its steps nearest to `turn_s` seconds (at least one)."""
    medians = [float(np.median(s)) if len(s) else 0.0 for s in steps]
    if turn_s is not None and min(medians) > 0:
        return [max(1, round(turn_s / m)) for m in medians]
    reps = [1, 1]
    if min(medians) > 0 and max(medians) >= MATCH_FROM * min(medians):
        reps[medians.index(min(medians))] = min(MAX_TURN_STEPS, round(max(medians) / min(medians)))
    return reps


def turn_sums(values: Sequence[float], turns: Sequence[int]) -> list[float]:
    """A lockstep side's per-step `values` summed over each of its turns (`turns`: steps per turn, in order)."""
    sums, i = [], 0
    for steps in turns:
        sums.append(float(sum(values[i:i + steps])))
        i += steps
    return sums


def device_turns(reps: Sequence[int], timed: bool = False) -> list[int]:
    """Steps per turn for sides that keep a step in flight: DEVICE_TURN_STEPS at least in every turn; `reps`
    scaled alike so their ratio (which matches the turns' lengths) holds, or, `timed` (turns of about `turn_s`
    each), each side's raised to the minimum on its own."""
    if timed:
        return [max(r, DEVICE_TURN_STEPS) for r in reps]
    scale = -(-DEVICE_TURN_STEPS // max(1, min(reps)))
    return [r * scale for r in reps]


def turns_of(result: ProbeResult) -> list[int] | None:
    """Steps per turn a lockstep side took, in order (one each where its result records none: pairs without
    matched turns); None where the record does not add up to its measured steps (a side that ended inside a
    turn)."""
    turns = (result.extra.get("lockstep") or {}).get("turns") or [1] * len(result.step_s)
    return list(turns) if sum(turns) == len(result.step_s) else None


def run_pair(specs: Sequence[ProbeSpec], workdir: Path, roles: Sequence[str], first: int = 0,
             noise: str = "each", first_takes_slot0: bool = False, match_turns: bool = False) -> list[ProbeResult]:
    """Measure two probes in lockstep and return both results, in the order of `specs`.

    `first` is the side that takes the first measured step. `noise` says when the measurement is steady enough
    to stop: "each" side's own step times within the protocol's noise bar (the gate, which reports each side's
    level), or the "ratio" of the two sides' step times known well enough (`ratio_settled`: the planner's duels,
    which need only the ratio; a machine swinging between speed states moves both sides alike, so the ratio
    settles long before either side does). Each side forks from a probe zygote of its own: side 0 from slot 0,
    or, with `first_takes_slot0` (the planner's duels, which alternate `first`), the side that moves first, so
    that a bias of either zygote flips with the order; sides that ask for a new parent (`ProbeSpec.fresh_parent`)
    get new zygotes, started together. `match_turns`: a side with much shorter steps takes several a turn (see
    the module's docstring). Each result is built as `runner.run_probe` builds it; `extra.lockstep` adds the
    child's steps, waiting time and step spans, why the pair stopped, and its steps per turn where a turn held
    more than one. A side that fails keeps its status; the other is stopped cleanly and keeps the steps it
    measured.
    """
    if len(specs) != 2 or specs[0].protocol != specs[1].protocol:
        raise ValueError("lockstep measures two probes under one protocol")
    workdir.mkdir(parents=True, exist_ok=True)
    channels: list[_Channel] = []
    probes: list[runner.Started] = []
    pair = None
    slots = [(side - first) % 2 if first_takes_slot0 else side for side in (0, 1)]
    try:
        runner.start_zygotes({slot: spec.preload for slot, spec in zip(slots, specs) if spec.fresh_parent})
        for side, (spec, role) in enumerate(zip(specs, roles)):
            slot = slots[side]
            channels.append(_Channel(workdir, spec.id))
            spec = dataclasses.replace(spec, lockstep=channels[-1].paths)
            ready_by = probes[0].deadline if probes else None  # the pair's deadline: the earlier side's
            probes.append(runner.start_probe(spec, workdir, role, slot=slot, ready_by=ready_by))  # a zygote each
        late = next((side for side, probe in enumerate(probes) if not probe.began), None)
        if late is None:
            pair = _Pair(probes, channels, noise, match_turns)
            why, culprit = pair.conduct(first)
        else:  # a side's new parent was not ready by the deadline: the pair ends as if that side timed out at once
            why, culprit = _time_out(probes, late)
    except BaseException:  # Ctrl-C or a fault of ours: leave nothing running behind us
        for probe in probes:
            probe.kill()
        for probe in probes:
            runner.finish_probe(probe)
        _close(channels)
        raise
    finally:
        if pair is not None:
            pair.close()
    # The channels stay until both children have ended: a side still importing its workload when its partner
    # ended opens them later and must find the "stop" waiting (removed first, it failed to join, "No such file or
    # directory", and ended as an error of its own settings rather than stopped by its partner)
    try:
        results = [runner.finish_probe(probe) for probe in probes]
    finally:
        _close(channels)
    _annotate(results, pair, first, why, culprit, specs[0].protocol)
    return results


def _annotate(results: list[ProbeResult], pair: _Pair | None, first: int, why: str, culprit: int | None,
              protocol: Protocol) -> None:
    """Each side's `extra.lockstep` (who went first, why the pair stopped, its partner, its steps per turn), and a
    side whose partner made the pair stop marked stopped by it."""
    for side, result in enumerate(results):
        partner = results[1 - side]
        result.extra.setdefault("lockstep", {}).update(first=side == first, stopped=why, partner=partner.id)
        if pair is not None and any(steps > 1 for steps in pair.turns[side]):
            result.extra["lockstep"]["turns"] = pair.turns[side]
        if culprit is not None and side != culprit and not _partner_finished(result, partner, protocol):
            _stopped_by_partner(result, partner)


def _close(channels: list[_Channel]) -> None:
    for channel in channels:
        channel.close()


def _partner_finished(result: ProbeResult, partner: ProbeResult, protocol: Protocol) -> bool:
    """Whether the partner ended on its own with a result (a script whose epochs ran out: script mode) after both
    sides measured the protocol's minimum of steps: the pair is then a whole comparison, only a shorter one."""
    return (partner.status is Status.OK and result.status is Status.OK
            and min(len(result.step_s), len(partner.step_s)) >= protocol.min_steps)


def _stopped_by_partner(result: ProbeResult, partner: ProbeResult) -> None:
    """The side of a pair whose partner failed: what it measured is half a comparison, neither its own verdict
    nor a failure of its settings (SIGKILLed with its partner on a timeout, or stopped after a few steps)."""
    result.extra.setdefault("lockstep", {})["partner_status"] = partner.status.value
    if result.status in (Status.OK, Status.CRASHED, Status.STOPPED) or PARTNER_ENDED in (result.error or ""):
        steps = len(result.step_s)
        after = (f"after {steps} measured step{'s' if steps != 1 else ''} of this side"
                 if result.status is Status.OK else "and this side was stopped with it")
        result.status = Status.STOPPED
        result.error = f"stopped: its lockstep partner {partner.id} ended ({partner.status.value}) {after}"


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (also for the zygote's children); None where the
    kernel has no pidfds, or the process is already gone (then it counts as exited)."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return os.open(os.devnull, os.O_RDONLY)  # always readable: exited
    except (AttributeError, OSError):
        return None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
