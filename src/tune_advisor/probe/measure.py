"""The probe child's measuring core, one for every driver of the steps: the workload-file trainer (training.py, which
the framework adapters feed through workload.py) and script mode (script/driver.py, where the user's script drives).

WarmUp says when the untimed steps are over; Window is the measured steps' clock and what is counted beside it (CPU
time, the loader's fetches, the GPU's NVML samples and energy counter); Measurement is what the window showed, and
`record` writes it into the result (`extra`, `memory`, `gpu`, the window's energy in `gpu.energy`). When to stop
measuring is window.py's StopRule. Runs only inside the child (torch is imported there anyway).
"""

from __future__ import annotations

import gc
import multiprocessing
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import psutil
import torch

from ..analysis.stats import period, wave_noise
from ..collectors.nvml import NvmlSampler
from .evidence import CompileStats, debug_switches, memory_peaks, tree_cpu_seconds

COMPILE_QUIET_STEPS = 3  # a compiled model is warm once this many steps in a row compiled nothing new
COMPILE_EXTRA_WARMUP = 30  # ... or after this many extra warm-up steps (shapes that never settle: see TA505)


class LoaderHung(Exception):
    """The training loader's workers delivered no batch within the probe's bound (ProbeSpec.loader_wait_s): the
    probe ends as a timeout at once, not when its limit or the budget runs out."""


def loader_timeout(spec_wait_s: float | None, workers: int, in_lockstep: bool) -> dict[str, float]:
    """The DataLoader's `timeout` argument for the bound: only with workers (the DataLoader's own timeout covers
    only theirs), and not for a lockstep side, whose workers sit paused (SIGSTOP) through its partner's turns."""
    return {"timeout": spec_wait_s} if spec_wait_s and workers > 0 and not in_lockstep else {}


def hung_loader(exc: RuntimeError, wait_s: float | None) -> LoaderHung | None:
    """The DataLoader's own timeout (`loader_timeout`) as LoaderHung, its workers killed first (hung ones ignore
    the polite shutdown, which waits 5 s for each); None for any other error."""
    if not wait_s or "DataLoader timed out after" not in str(exc):
        return None
    # torch's SIGCHLD handler raises "DataLoader worker ... is killed by signal" wherever this thread is when a
    # worker dies, which would replace the timeout with a crash: it is off while the workers are killed and reaped.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL) if main else None
    try:
        for worker in multiprocessing.active_children():
            worker.kill()
            worker.join()
    finally:
        if main:
            signal.signal(signal.SIGCHLD, previous)
    return LoaderHung(f"the training loader's workers delivered no batch within {wait_s:g} s (the bound from the "
                      "baseline's batch time): they hang")


def whole(steps: int, cycle: int) -> int:
    """`steps` rounded up to whole cycles."""
    return -(-steps // cycle) * cycle


def add_outside_step(raw: dict[str, list], epoch_starts: list[int], step_s: float, wait_s: float, items: float,
                     loss: float | None, step: int, new_epoch: bool) -> None:
    """A measured step timed from outside the loop that ran it (a framework's, a script's): its time, the part it
    waited for data, its items and loss at global step `step`; the copy to the device is the loop's own and not
    separable from outside (0)."""
    raw["step_s"].append(step_s)
    raw["data_wait_s"].append(min(wait_s, step_s))
    raw["h2d_s"].append(0.0)
    raw["items"].append(items)
    if loss is not None:
        raw["loss"].append(loss)
        raw["loss_step"].append(step)
    if new_epoch:
        epoch_starts.append(len(raw["step_s"]) - 1)


class WarmUp:
    """When the untimed steps are over: after the protocol's warm-up steps and the loader's prefetched backlog, then,
    for a compiled model, once COMPILE_QUIET_STEPS steps in a row compiled nothing new (or after COMPILE_EXTRA_WARMUP
    more), always at whole accumulation cycles of `cycle` steps, so the measured steps begin one."""

    def __init__(self, protocol_steps: int, workers: int, prefetch: int, compile_stats: CompileStats | None,
                 cycle: int = 1, minimum: int = 0):
        # Loader workers fill a queue of prefetch_factor batches each before training starts; timing that backlog
        # would credit many workers with a burst no long run sees.
        self.target = whole(max(protocol_steps, workers * prefetch, minimum), cycle)
        self.compile_stats, self.cycle = compile_stats, cycle
        self.step_s: list[float] = []  # the warm-up steps' seconds, as far as the driver can time them
        self.quiet, self.graphs, self.settled = 0, None, compile_stats is None

    def over(self, steps: int) -> bool:
        """Whether warm-up is over after `steps` steps (called after each)."""
        if steps < self.target:
            return False
        if not self.settled:  # dynamo recompiles when input shapes change: wait until it compiles nothing new
            graphs = self.compile_stats.graphs()
            self.quiet = self.quiet + 1 if graphs == self.graphs else 0
            self.graphs = graphs
            self.settled = self.quiet >= COMPILE_QUIET_STEPS or steps >= self.target + COMPILE_EXTRA_WARMUP
        return self.settled and steps % self.cycle == 0

    def done(self, extra: dict[str, Any], steps: int, seconds: float) -> None:
        """Warm-up ended after `steps` steps, `seconds` long: written into the result's `extra` at once (a probe
        that fails while measuring still shows its warm-up)."""
        extra.update({"warmup_s": seconds, "warmup_steps": steps, "warmup_step_s": self.step_s})
        if self.compile_stats:
            self.compile_stats.mark("warmup")


@dataclass(frozen=True)
class Spent:
    """What the measured window took: its wall seconds, the process tree's CPU seconds (loader workers included),
    and the training loader's fetches in this thread: their wall and CPU seconds."""

    wall_s: float
    cpu_s: float
    fetch_wall_s: float
    fetch_cpu_s: float


class Window:
    """The measured steps' clock, opened when warm-up ends and closed after the last measured step, and what runs
    beside it: the process tree's CPU time, the training loader's fetches (`fetches()`: their running wall and CPU
    seconds), and an NVML sampler (a sleeping thread; on the CPU or without NVML it notes why), which reads the
    GPU's energy counter where the clock opens and closes."""

    def __init__(self, device: str, fetches: Callable[[], tuple[float, float]]):
        self.device, self.fetches = device, fetches
        self.sampler: NvmlSampler | None = None
        self.spent: Spent | None = None

    def open(self) -> float:
        """Start measuring now; returns the clock's start (perf_counter seconds), where the first measured step
        begins. A full garbage collection comes first: start-up (imports, a framework's setup) leaves a backlog
        that makes Python's next full collection due within the first hundreds of steps, and in a process holding
        torch and a framework it takes ~0.2 s, a once-a-run cost that would land in a short window (one such
        collection read a 2 ms-step loop 25-45% slow; benchmarks/results/framework_fidelity.md). A long run pays
        it once at its start, so the window is measured after it."""
        gc.collect()
        self.sampler = NvmlSampler(self.device)
        self.sampler.start()
        self.process = psutil.Process()
        self.cpu_before = tree_cpu_seconds(self.process)
        self.fetch_before = self.fetches()
        self.sampler.mark_energy()  # beside the clock's start: energy and time cover the same steps
        self.started = time.perf_counter()
        return self.started

    @property
    def opened(self) -> bool:
        return self.sampler is not None

    def elapsed(self, now: float | None = None) -> float:
        return (time.perf_counter() if now is None else now) - self.started

    def close(self, wall_s: float | None = None) -> None:
        """Stop measuring; `wall_s`: the window's seconds where not the time since it opened (a lockstep side's:
        less its partner's turns). Closing again, or a window never opened, changes nothing."""
        if not self.opened or self.spent is not None:
            return
        wall = self.elapsed() if wall_s is None else wall_s
        self.sampler.mark_energy()  # beside the clock's end
        fetch_wall, fetch_cpu = self.fetches()
        self.spent = Spent(wall, tree_cpu_seconds(self.process) - self.cpu_before,
                           fetch_wall - self.fetch_before[0], fetch_cpu - self.fetch_before[1])
        self.sampler.stop()


@dataclass
class Measurement:
    """What a measured window showed besides each step's figures (those are in `raw`): the result's `extra` keys
    that every driver writes. `workers`: the training loader's; `cycle`: steps per optimizer step."""

    spent: Spent
    workers: int
    epochs_started: int
    epoch_steps: int | None  # batches per epoch with loader workers (None: none, or no length)
    epoch_start_steps: list[int]  # measured steps whose batch began an epoch
    input_shapes: int  # distinct per-sample input shapes seen
    cycle: int = 1

    def fetch_cpu_frac(self) -> float | None:
        """Share of the measured fetches' wall time this thread spent on a CPU, when it loaded the batches itself
        (no workers): near 1 for decoding and augmenting, near 0 for a loader waiting on storage or the network (the
        planner's worker ladder). The loading thread's time only, so the intra-op threads' spin after a step is not
        counted as loading."""
        if self.workers > 0 or self.spent.fetch_wall_s <= 0:
            return None
        return min(1.0, self.spent.fetch_cpu_s / self.spent.fetch_wall_s)

    def extra(self, step_s: list[float]) -> dict[str, Any]:
        wall = self.spent.wall_s
        return {
            "measured_wall_s": wall,
            "cpu_util": self.spent.cpu_s / wall / (psutil.cpu_count() or 1) if wall > 0 else None,
            "fetch_cpu_frac": self.fetch_cpu_frac(),
            "epochs_started": self.epochs_started,
            "torch_threads": torch.get_num_threads(),
            # the series repeats over loader waves and accumulation cycles: its noise is judged over both
            "noise": wave_noise(step_s, period(self.workers, self.cycle)),
            "epoch_start_steps": self.epoch_start_steps,
            "epoch_steps": self.epoch_steps,
            "distinct_input_shapes": self.input_shapes,
            "input_shapes_static": self.input_shapes <= 1,
            **debug_switches(),
        }


def record(out: dict[str, Any], measured: Measurement, window: Window, warm: WarmUp, compile_mode: str,
           lockstep_report: dict[str, Any] | None) -> None:
    """The measured window into the result `out`: compile outcome, the Measurement, the lockstep report, memory
    peaks (the measured steps', before any extra step) and the GPU's samples."""
    extra, step_s = out["extra"], out["raw"]["step_s"]
    if warm.compile_stats:
        extra["compile"] = warm.compile_stats.summary(compile_mode, warm.step_s, step_s)
    extra.update(measured.extra(step_s))
    if lockstep_report is not None:
        extra["lockstep"] = lockstep_report
    out["memory"] = memory_peaks(window.device)
    out["gpu"] = window.sampler.result()
    if out["gpu"] is not None:
        out["gpu"]["energy"] = window_energy(window, sum(out["raw"].get("items") or []), lockstep_report is not None)


def window_energy(window: Window, items: float, lockstep: bool) -> dict[str, Any]:
    """The GPU's energy over the measured window (`gpu.energy`), absent for a lockstep side: its window leaves out
    its partner's turns, while the counter, the whole board's, ran through them."""
    why = "absent: measured in lockstep, where the GPU's counter also ran through the partner's turns" \
        if lockstep else None
    return window.sampler.energy(items, window.spent.wall_s if window.spent else None, why)
