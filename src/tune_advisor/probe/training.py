"""The probe child's training run of a workload file (a framework's own loop is loop.py's): build it with
the settings applied, warm up, time the measured steps, then run the collectors that need steps of their own. The
clock, the windows and the record are measure.py's, shared with script mode. A DDP rank plugs in as a `Group`
(distributed/rank.py). Runs only inside the child (torch is imported there anyway).
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from .. import workload as wl_mod
from . import apply, device_clock, extra_steps, lockstep, measure
from .evidence import CompileStats, KnobEvidence, StepSeries, optimizer_flags
from .measure import Measurement, WarmUp, Window, record
from .spec import ProbeSpec
from .window import StopRule


class Diverged(Exception):
    """The loss became NaN or infinite."""


class Group(Protocol):
    """One rank of a DDP job, as the training loop uses it (distributed/rank.py's Rank)."""

    device: torch.device

    def wrap(self, model): ...  # the model in DistributedDataParallel

    def sampler(self, dataset, seed: int): ...  # this rank's shard of the data (None: read it whole)

    def agree(self, stop: bool) -> bool: ...  # rank 0's stop decision, for every rank

    def local_steps(self, model, run_step: Callable[[int], float]) -> list[float]: ...  # steps without sync


def load(spec: ProbeSpec, phase: Callable[[str], None], out: dict[str, Any]) -> wl_mod.Workload:
    """The workload file loaded (a framework's: adapted), and the result's unit."""
    phase("importing the workload file")
    wl = wl_mod.load(spec.workload)
    out["unit"] = f"{wl.item_name}/s"
    return wl


def train(spec: ProbeSpec, phase: Callable[[str], None], out: dict[str, Any], workdir: Path | None = None,
          group: Group | None = None, wl: wl_mod.Workload | None = None) -> None:
    """Fill the result `out` for one configuration; raises on any failure (the caller makes it a status). A profiler
    trace goes to `workdir`; `group`: this process's rank when the probe is distributed; `wl`: loaded already."""
    run = Training(spec, phase, out, group, wl)
    run.warm_up()
    run.measure()
    run.record()
    run.collect(workdir)


class Training:
    """One configuration's training loop. Building it loads the workload, applies the settings and sets up the
    model, optimizer and loader; then `warm_up`, `measure`, `record` and `collect` run in that order, each filling
    its part of the result `out` (`raw`, `applied`, `extra`, `memory`, `gpu`)."""

    def __init__(self, spec: ProbeSpec, phase: Callable[[str], None], out: dict[str, Any], group: Group | None = None,
                 wl: wl_mod.Workload | None = None):
        self.spec, self.phase, self.out, self.settings = spec, phase, out, spec.settings
        self.baton = lockstep.baton(spec)  # lockstep pairs: the parent hands out the warm-up's turn and every step
        self.ddp = group  # a torchrun rank has joined its group already
        self.device = self.ddp.device if self.ddp else torch.device(spec.device)
        self.wl = wl = wl or load(spec, phase, out)
        _seed(spec.seed)
        phase("building the model and dataset")
        model = wl.call("build_model")
        dataset = wl.call("build_dataset")
        self._set_up_model(model)
        self._set_up_loader(dataset)
        self.epoch_steps = _epoch_steps(self.loader) if self.settings["num_workers"] > 0 else None
        self.series = StepSeries(out["raw"], lambda host_batch: count_items(wl, host_batch))
        self.batches = None  # the loader's iterator, from the warm-up on
        self.epochs = 0  # epoch boundaries crossed
        self.next_step = 0  # the global step (warm-up counted) of the next step
        self.window = Window(spec.device, lambda: (self.fetch_wall_s, self.fetch_cpu_s))

    def _set_up_model(self, model) -> None:
        """The settings applied to the model, its optimizer, compilation and gradient scaler, with their evidence."""
        settings, device, applied = self.settings, self.device, self.out["applied"]
        apply.configure_backends(settings, device.type)
        applied.update(apply.prepare_model(model, settings, device))
        model = self.ddp.wrap(model) if self.ddp else model
        self.optimizer = apply.optimizer_impl(build_optimizer(self.wl, model), settings["optimizer_impl"])
        applied["optimizer"] = optimizer_flags(self.optimizer)
        self.compiled = settings["compile"] != "off"
        self.evidence = KnobEvidence(model, settings, hooks=not self.compiled)  # hooks would be traced into the
        self.model = apply.compile_model(model, settings)  # graph, then removed: a recompile wrongly counted
        self.compile_stats = CompileStats() if self.compiled else None
        self.scaler = apply.grad_scaler(settings, device.type)
        self.loss_fn = self.wl.compute_loss or wl_mod.default_loss
        applied["grad_scaler"] = self.scaler is not None
        # A framework's loop (a Trainer's gradient accumulation and clipping) steps the optimizer as the user's does;
        # a plain workload steps it after every batch.
        rule = self.wl.optimizer_step
        self.every = rule.every(settings["batch_size"]) if rule else 1
        self.clip = rule if rule and rule.clip_value is not None else None
        applied["optimizer_step"] = {"every": self.every,
                                     "clip": f"{self.clip.clip} {self.clip.clip_value:g}" if self.clip else None}

    def _set_up_loader(self, dataset) -> None:
        settings, device, seed = self.settings, self.device, self.spec.seed
        iterable = isinstance(dataset, IterableDataset)
        shard = self.ddp.sampler(dataset, seed) if self.ddp else None  # each rank reads its own part of the data
        self.loader = DataLoader(dataset, shuffle=not iterable and shard is None, sampler=shard,
                                 collate_fn=self.wl.collate_fn,
                                 generator=None if iterable else torch.Generator().manual_seed(seed),
                                 **apply.loader_kwargs(settings, device.type),
                                 **measure.loader_timeout(self.spec.loader_wait_s, settings["num_workers"],
                                                          self.baton.active))
        self.non_blocking = self.loader.pin_memory
        self.channels_last = bool(settings["channels_last"])
        self.cuda = device.type == "cuda"
        # A GPU's steps are timed on the GPU, read a few steps late (a lockstep side: one), so the host can enqueue
        # the next batch's copy while the GPU computes (probe/device_clock.py); DDP steps must end before the next.
        self.clock = device_clock.for_probe(device.type, torch.cuda if self.cuda else None,
                                            host_paced=self.ddp is not None, lockstep=self.baton.active)
        self.in_flight: dict[int, tuple] = {}  # step -> what the host saw of it, until the device has run it
        self.host_copy_s: list[float] = []  # measured steps: the host's time in the copy call, and the device's
        self.device_copy_s: list[float | None] = []
        # Without workers the batches are loaded in this thread: the fetches' wall and this thread's CPU time (the
        # measured window's share: measure.Window) tell a CPU-bound loader from one waiting on I/O.
        self.fetch_wall_s = self.fetch_cpu_s = 0.0

    def next_batch(self):
        try:
            return self._next_batch()
        except RuntimeError as exc:  # the loader's workers hung past the bound (measure.loader_timeout)
            raise measure.hung_loader(exc, self.loader.timeout) or exc

    def _next_batch(self):
        try:
            return next(self.batches)
        except StopIteration:  # epoch boundary: a new iterator (and new workers) as training would
            self.epochs += 1
            self.batches = iter(self.loader)
            return next(self.batches)

    def step(self, step: int, record: bool, drain: bool = False) -> float:
        """One training step, global step `step`; `record`: a measured step, its figures kept; `drain`: wait for
        it to end (a lockstep turn's last step). Returns its seconds; raises Diverged when the loss is not finite."""
        t0, cpu0 = time.perf_counter(), time.thread_time()
        epoch = self.epochs
        host_batch = self.next_batch()
        t1 = time.perf_counter()
        self.fetch_wall_s += t1 - t0
        self.fetch_cpu_s += time.thread_time() - cpu0
        self.clock.copy_start()
        batch = apply.to_device(host_batch, self.device, self.non_blocking, self.channels_last)
        self.clock.copy_end()
        t2 = time.perf_counter()
        with apply.autocast(self.settings, self.device.type):
            loss = self.loss_fn(self.model, batch)
        scaled = loss / self.every if self.every > 1 else loss  # accumulated gradients average the micro-batches
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        if (step + 1) % self.every == 0:
            self.optimizer_step()
        # The host batch stays referenced until the device has run the step: its pinned pages feed an async copy.
        self.in_flight[step] = (t0, t1, t2, host_batch, record, self.epochs != epoch)
        finished = self.clock.end(step, loss, t0, sync=drain or not record)  # warm-up, extra steps: over at once
        if step == 0:
            self.evidence.after_first_step(host_batch, batch, self.loader, self.batches)
        seconds = [self._finished(done) for done in finished]
        return seconds[-1] if seconds else float("nan")

    def optimizer_step(self) -> None:
        """The optimizer's step over the accumulated gradients, clipped first when the framework clips."""
        if self.clip is not None:
            if self.scaler is not None:  # clip the true gradients, not the scaled ones
                self.scaler.unscale_(self.optimizer)
            clip = torch.nn.utils.clip_grad_norm_ if self.clip.clip == "norm" else torch.nn.utils.clip_grad_value_
            clip(self.model.parameters(), self.clip.clip_value)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _finished(self, done: device_clock.Finished) -> float:
        """A step the device has run: its loss checked, its figures kept if it was measured. Returns its seconds."""
        t0, t1, t2, host_batch, record, new_epoch = self.in_flight.pop(done.step)
        if not math.isfinite(done.loss):
            self.series.non_finite_loss(done.step)
            kind = "warm-up " if not record else ""
            raise Diverged(f"loss became {done.loss} at {kind}step {done.step + 1}")
        if record:
            self.series.add(done.step, t0, t1, t2, t0 + done.seconds, host_batch, done.loss, new_epoch=new_epoch)
            self.host_copy_s.append(t2 - t1)
            self.device_copy_s.append(done.copy_s)
        return done.seconds

    def forward_backward(self) -> float:
        """One step's forward and backward without the optimizer (for the FLOP counter); returns its items."""
        host_batch = self.next_batch()
        batch = apply.to_device(host_batch, self.device, self.non_blocking, self.channels_last)
        with apply.autocast(self.settings, self.device.type):
            loss = self.loss_fn(self.model, batch)
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        self.optimizer.zero_grad(set_to_none=True)
        return count_items(self.wl, host_batch)

    def extra_step(self, i: int) -> float:
        """The `i`-th step after the measured ones (for the collectors), not recorded."""
        return self.step(self.next_step + i, record=False)

    def warm_up(self) -> None:
        """Untimed steps (measure.WarmUp): the loader's prefetched backlog drained and, compiled, compiling settled."""
        settings, phase = self.settings, self.phase
        # Both sides of a lockstep pair import and build at once (mostly Python: hf_transformer's import takes 2 s);
        # the warm-ups, where torch's threads spin, take turns. Starting the loader's workers is part of the warm-up.
        self.baton.begin(self.epoch_steps, self.every, in_flight=self.clock.lag)
        self.batches = iter(self.loader)
        phase(f"warm-up: waiting for the first batch ({settings['num_workers']} loader workers)")
        warmup_start = time.perf_counter()
        compile_stats = self.compile_stats
        self.warm = warm = WarmUp(self.spec.protocol.warmup_steps, settings["num_workers"],
                                  settings["prefetch_factor"], compile_stats, cycle=self.every)
        steps = 0
        while not warm.over(steps):
            if steps >= warm.target:
                phase(f"warm-up step {steps + 1}: torch.compile may still be compiling")
            elif compile_stats and steps == 0:
                phase("warm-up step 1: torch.compile compiling the model")
            warm.step_s.append(self.step(steps, record=False))
            steps += 1
            if compile_stats and steps == 1:
                compile_stats.mark("first_step")
            if steps <= warm.target:
                phase(f"warm-up step {steps} of {warm.target} done")
        warm.done(self.out["extra"], steps, time.perf_counter() - warmup_start)
        self.next_step = steps

    def measure(self) -> None:
        """The timed steps, until the stopping rule says stop (in lockstep: the parent; under DDP: rank 0 for all)."""
        spec, raw, baton, ddp, window = self.spec, self.out["raw"], self.baton, self.ddp, self.window
        stop = StopRule(spec.protocol, self.settings["num_workers"], self.epoch_steps, cycle=self.every)
        self.phase("measuring")
        window.open()
        try:
            while baton.wait():  # always true unless in lockstep, where the parent decides when both sides stop
                self.clock.begin()  # a lockstep side's step is timed from its baton (device_clock)
                ended = len(raw["step_s"])
                self.step(self.next_step, record=True, drain=baton.last)
                if baton.active:  # the steps that ended by now (on a GPU inside a turn: the one before this)
                    baton.hand_over(list(zip(raw["step_s"][ended:], raw["items"][ended:])))
                self.next_step += 1
                if baton.active:
                    continue
                done = stop.done(raw["step_s"], window.elapsed())
                if ddp.agree(done) if ddp else done:  # DDP ranks must run the same steps: rank 0 decides for all
                    break
            for done in self.clock.flush():  # the steps still on the GPU: measured, so they count
                self._finished(done)
        finally:
            window.close(window.elapsed() - baton.idle_s)  # lockstep: less the partner's turns

    def record(self) -> None:
        """What the measured steps showed besides their figures (measure.record), the copies' overlap, the
        accumulation cycle, the knobs' evidence."""
        out, extra = self.out, self.out["extra"]
        shapes = self.series.shape_facts()
        measured = Measurement(self.window.spent, self.settings["num_workers"], self.epochs, self.epoch_steps,
                               shapes["epoch_start_steps"], shapes["distinct_input_shapes"], cycle=self.every)
        record(out, measured, self.window, self.warm, self.settings["compile"], self.baton.report())
        extra["optimizer_every"] = self.every
        extra["largest_input"] = self.series.largest_input  # what the memory peak saw (cuda_memory.judged_peak)
        extra["step_clock"] = self.clock.name  # what the steps were timed by: the planner pairs on it (pairing.py)
        copies = device_clock.overlap(self.host_copy_s, self.device_copy_s)
        if copies is not None:  # a GPU timed by events: how much of each batch's copy the host did not wait for
            extra["h2d"] = {**copies, "non_blocking": self.non_blocking, "clock": "cuda events"}
        out["applied"].update(self.evidence.report())

    def collect(self, workdir: Path | None) -> None:
        """Collectors that need steps of their own run now, after the timing, and never fail the probe."""
        spec, out, phase = self.spec, self.out, self.phase
        collectors = out["extra"]["collectors"] = {"nvml": self.window.sampler.status}
        if self.ddp:  # extra steps for FLOPs or the profiler would need every rank to join their all-reduces alike
            out["extra"]["local_step_s"] = self.ddp.local_steps(self.model, self.extra_step)
            collectors["flops"] = collectors["profiler"] = "skipped: distributed probe"
            phase("done")
            return
        if spec.count_flops:
            phase("counting FLOPs of one step")
            collectors["flops"] = extra_steps.count_flops(spec, out, self.forward_backward)
        else:
            collectors["flops"] = "skipped: a re-measurement (the first probe of these settings counted them)"
        if spec.profile:
            phase("profiling extra steps")
            profile_start = time.perf_counter()
            collectors["profiler"] = extra_steps.profile(spec, out, workdir, self.extra_step)
            out["extra"]["profile_wall_s"] = time.perf_counter() - profile_start  # not part of an unprofiled probe
        else:
            collectors["profiler"] = "skipped: not a designated probe"
        phase("done")


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)


def build_optimizer(wl, model):
    """The workload's optimizer over the model's parameters, or AdamW(lr=1e-3) when it builds none."""
    if wl.build_optimizer:
        return wl.call("build_optimizer", model.parameters())
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def _epoch_steps(loader) -> int | None:
    """Batches per epoch, or None when the dataset has no length (an IterableDataset without __len__)."""
    try:
        return len(loader) or None
    except TypeError:
        return None


def count_items(wl, host_batch) -> float:
    """The batch's work: what the workload's count_items says, else the first tensor's batch dimension."""
    if wl.count_items is not None:
        return float(wl.count_items(host_batch))
    tensor = apply.first_tensor(host_batch)
    return float(tensor.shape[0]) if tensor is not None and tensor.dim() > 0 else 1.0
