"""The probe child's run of a framework's own loop (`trainer.train()`, `Trainer.fit()`: frameworks/ `Loop`), measured
with the measuring core (measure.py: warm-up, the window's clock, the record; window.py's StopRule). The framework
applies the settings as its own arguments and reports each step's end to `LoopSteps` (frameworks `LoopProbe`);
`Fetches` times the loader's batches from the iterator the framework reads. A lockstep side waits for its turn at
each step's end, inside the framework's loop, as script mode does inside a script's. Runs only inside the child.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import dataloader as torch_loader

from . import apply, lockstep
from .evidence import CompileStats, optimizer_flags, sample_shape
from .measure import Measurement, WarmUp, Window, add_outside_step, record
from .spec import ProbeSpec
from .training import Diverged, count_items
from .window import StopRule

MIN_MEASURED_STEPS = 2  # training that ended by itself after fewer measured steps than this measured nothing


class Fetches:
    """The batches the framework's loop reads, timed where torch's DataLoader iterator hands them out (in the training
    thread: loader workers' own reads are not waits): wall and CPU seconds, items, epochs begun, per-sample shapes.
    `take()` gives what arrived since the last step."""

    def __init__(self, items: Callable[[Any], float]):
        self.items_of, self.main = items, threading.get_ident()
        self.wall_s = self.cpu_s = 0.0  # all fetches so far (measure.Window reads its share)
        self.wait_s, self.items, self.new_epoch = 0.0, 0.0, False  # since the last step
        self.epochs = 0
        self.shapes: set = set()
        self.undo: list[Callable[[], None]] = []

    def install(self) -> None:
        cls, fetches = torch_loader._BaseDataLoaderIter, self
        original = cls.__next__

        def timed_next(iterator):
            if threading.get_ident() != fetches.main:
                return original(iterator)
            first = getattr(iterator, "_num_yielded", None) == 0  # an epoch's first batch (persistent workers too)
            t0, cpu0 = time.perf_counter(), time.thread_time()
            batch = original(iterator)
            fetches.arrived(batch, time.perf_counter() - t0, time.thread_time() - cpu0, first)
            return batch

        cls.__next__ = timed_next
        self.undo.append(lambda: setattr(cls, "__next__", original))

    def remove(self) -> None:
        while self.undo:
            self.undo.pop()()

    def arrived(self, batch: Any, wall: float, cpu: float, first: bool) -> None:
        if first:
            self.epochs += 1
            self.new_epoch = True
        self.wall_s += wall
        self.cpu_s += cpu
        self.wait_s += wall
        self.items += self.items_of(batch)
        self.shapes.add(sample_shape(batch))

    def take(self) -> tuple[float, float, bool]:
        """(wait seconds, items, whether an epoch began) since the last call."""
        taken = (self.wait_s, self.items, self.new_epoch)
        self.wait_s, self.items, self.new_epoch = 0.0, 0.0, False
        return taken


class LoopSteps:
    """The probe's side of the framework's loop (frameworks `LoopProbe`): warm-up steps, then measured ones until
    the StopRule (in lockstep: the parent) says done; each step's end is the framework's (an optimizer step for a
    Trainer, a batch for Lightning)."""

    def __init__(self, spec: ProbeSpec, out: dict[str, Any], phase: Callable[[str], None], fetches: Fetches):
        self.spec, self.out, self.raw, self.phase, self.fetches = spec, out, out["raw"], phase, fetches
        self.device_type = torch.device(spec.device).type
        self.window = Window(spec.device, lambda: (fetches.wall_s, fetches.cpu_s))
        self.baton = lockstep.baton(spec)
        self.steps, self.cycle, self.workers = 0, 1, 0
        self.loader: Any = None
        self.warm: WarmUp | None = None
        self.stop: StopRule | None = None
        self.epoch_steps: int | None = None
        self.epoch_starts: list[int] = []
        self.last: float | None = None

    def started(self, loader: Any, cycle: int, per_step: int = 1) -> None:
        """Before the first batch: the loader's facts, the warm-up's target, a lockstep side's turn to warm up."""
        self.loader, self.cycle = loader, max(1, cycle)
        self.workers = int(getattr(loader, "num_workers", 0) or 0)
        prefetch = (getattr(loader, "prefetch_factor", None) or 0) if self.workers else 0
        compile_stats = CompileStats() if self.spec.settings.get("compile", "off") != "off" else None
        self.warm = WarmUp(self.spec.protocol.warmup_steps, self.workers, prefetch, compile_stats,
                           cycle=self.cycle, minimum=1)  # at least one: measuring starts at a step's end
        if self.workers > 0:
            try:
                self.epoch_steps = len(loader) // max(1, per_step) or None
            except TypeError:
                self.epoch_steps = None
        self.baton.begin(self.epoch_steps, self.cycle)
        self.phase("framework loop: warm-up")
        # The first step is timed from here, as a workload file's is from its first fetch: it holds the loader's
        # start and torch.compile's compiling. Untimed, a Trainer's compile read 0.01 s where each compiled
        # probe's process ran 9-13 s longer than its uncompiled twin (hf_trainer), and TA504 said so.
        self.last = time.perf_counter()

    def step_ended(self, loss: float | None) -> bool:
        if self.warm is None:
            raise RuntimeError("the framework's loop stepped before it started (no train-begin hook ran)")
        if self.window.spent is not None:  # stopped already: the loop ran one more step
            return True
        _sync(self.device_type)
        now = time.perf_counter()
        self.steps += 1
        wait, items, new_epoch = self.fetches.take()
        if loss is not None and not math.isfinite(loss):
            self.raw["loss"].append(None)  # JSON has no NaN: kept as null
            self.raw["loss_step"].append(self.steps - 1)
            raise Diverged(f"loss became {loss} at step {self.steps}")
        if self.stop is None:  # warming up
            self.warm.step_s.append(now - self.last)
            self.last = now
            if self.steps == 1 and self.warm.compile_stats:
                self.warm.compile_stats.mark("first_step")
            if not self.warm.over(self.steps):
                self.phase(f"framework loop: warm-up step {self.steps} done")
                return False
            self._begin()
            return self._next_turn()
        self._measured(now, wait, items, new_epoch, loss)
        if self.baton.active:  # the parent decides when both sides of the pair stop
            self.baton.done(self.raw["step_s"][-1], self.raw["items"][-1])
            return self._next_turn()
        if self.stop.done(self.raw["step_s"], self.window.elapsed(now)):
            self.window.close(self.window.elapsed(now))
            return True
        return False

    def _measured(self, now: float, wait: float, items: float, new_epoch: bool, loss: float | None) -> None:
        add_outside_step(self.raw, self.epoch_starts, now - self.last, wait, items, loss, self.steps - 1, new_epoch)
        self.last = now

    def _begin(self) -> None:
        self.stop = StopRule(self.spec.protocol, self.workers, self.epoch_steps, cycle=self.cycle)
        self.warm.done(self.out["extra"], self.steps, sum(self.warm.step_s))
        self.last = self.window.open()  # the first measured step starts here
        self.phase("framework loop: measuring")

    def _next_turn(self) -> bool:
        """A lockstep side waits for the baton before its next measured step (True: the parent said stop)."""
        if not self.baton.active:
            return False
        if not self.baton.wait():
            self.window.close(self.window.elapsed() - self.baton.idle_s)
            return True
        self.last = time.perf_counter()
        return False

    def optimizer_impl(self, optimizer: Any) -> Any:
        rebuilt = apply.optimizer_impl(optimizer, self.spec.settings["optimizer_impl"])
        self.out["applied"]["optimizer"] = optimizer_flags(rebuilt)
        return rebuilt

    def prepare_model(self, model: Any) -> dict[str, Any]:
        settings = self.spec.settings
        done: dict[str, Any] = {}
        if settings.get("channels_last"):
            model.to(memory_format=torch.channels_last)
            done["channels_last"] = True
        if settings.get("checkpointing") and not getattr(model, "supports_gradient_checkpointing", False):
            done["checkpointing"] = apply.enable_checkpointing(model)
        return done


def _sync(device_type: str) -> None:
    if device_type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.synchronize()  # a step ends when the device has run it


def train(spec: ProbeSpec, phase: Callable[[str], None], out: dict[str, Any], workdir: Path | None, wl) -> None:
    """Run the workload's framework loop under `spec.settings` and fill the result `out`; raises on any failure."""
    settings = spec.settings
    apply.configure_backends(settings, torch.device(spec.device).type)  # global switches (matmul, cudnn)
    torch.manual_seed(spec.seed)
    fetches = Fetches(lambda batch: count_items(wl, batch))
    steps = LoopSteps(spec, out, phase, fetches)
    scratch = Path(tempfile.mkdtemp(prefix="framework-", dir=workdir or os.environ.get("TMPDIR") or None))
    phase(f"framework loop: {wl.framework['name']} training, before its first step")
    fetches.install()
    try:
        out["applied"].update(wl.loop.run(dict(settings), spec.device, steps, scratch))
    finally:
        fetches.remove()
        steps.window.close(sum(out["raw"]["step_s"]))  # ended by itself: its measured steps so far are the window
    measured = len(out["raw"]["step_s"])
    if measured < MIN_MEASURED_STEPS and not steps.baton.active:
        raise RuntimeError(f"the framework's training ended by itself after {steps.steps} steps, {measured} of them "
                           f"measured; a probe needs at least {MIN_MEASURED_STEPS}")
    if not measured:  # a lockstep side stopped before its first measured step (the runner says so)
        return
    _record(out, steps, fetches)


def _record(out: dict[str, Any], steps: LoopSteps, fetches: Fetches) -> None:
    shapes = {s for s in fetches.shapes if s is not None}
    measured = Measurement(steps.window.spent, steps.workers, fetches.epochs, steps.epoch_steps, steps.epoch_starts,
                           len(shapes), cycle=steps.cycle)
    record(out, measured, steps.window, steps.warm, steps.spec.settings.get("compile", "off"), steps.baton.report())
    out["extra"]["optimizer_every"] = steps.cycle
    loader = steps.loader
    out["applied"].update({"loader_workers": steps.workers,
                           "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
                           "prefetch_factor": getattr(loader, "prefetch_factor", None),
                           "matmul_precision": torch.get_float32_matmul_precision()})
    skipped = "skipped: the framework's own loop drives the steps"
    out["extra"]["collectors"] = {"nvml": steps.window.sampler.status, "flops": skipped, "profiler": skipped}
