"""Script mode in the probe child: run the user's unmodified script (`runpy`, as `python train.py ARGS` would) with
script/hooks.py's patches, and measure its optimizer steps with the probe's own measuring core (probe/measure.py:
warm-up, the window's clock, the record; probe/window.py's StopRule). What is left here is script mode's own: the
step hook's side of the protocol, running the script, and naming how it ended.

`train` is a probe (like probe/training.py's `train`, it fills the result `out`); `inspect` runs the script as it
is, settings untouched, to a few optimizer steps and reports what it saw (or why it cannot be measured: the parent
turns that into exit code 2). The script runs with stdin closed, in a scratch folder mirroring the caller's
(script/mirror.py: it reads the caller's files, its checkpoints and logs land in the scratch folder, removed with
the probe's temporary folder, and are listed) unless the spec names a folder, and ends by a ScriptStop raised from
the step hook once the probe has its steps.
"""

from __future__ import annotations

import contextlib
import math
import os
import runpy
import shlex
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

import torch

from .. import knobs
from .. import workload as wl_mod
from ..probe import apply, device_clock, failure, lockstep
from ..probe.evidence import CompileStats
from ..probe.measure import Measurement, WarmUp, Window, add_outside_step, record
from ..probe.result import Status
from ..probe.spec import ProbeSpec
from ..probe.window import StopRule
from . import flags
from . import group as group_mod
from .hooks import Hooks, ScriptStop
from .mirror import Mirror

INSPECT_STEPS = 3  # inspect mode runs this many optimizer steps: enough to see a second optimizer step
MIN_MEASURED_STEPS = 2  # a script that ends by itself after fewer measured steps than this measured nothing
BEFORE_FIRST_STEP = "before its first optimizer step"


def alone(world_size: int) -> str:
    """Why a script that never initialises a process group cannot be a DDP probe."""
    return (f"it never calls torch.distributed.init_process_group, so under --nproc-per-node each of the "
            f"{world_size} ranks would train alone (no gradients shared): {world_size} separate trainings, "
            "not one DDP job")


class OutputTail:
    """A stream wrapper keeping the last characters written (an argparse error names the bad argument)."""

    def __init__(self, stream, limit: int = 2000):
        self.stream, self.tail, self.limit = stream, deque(), limit
        self.size = 0

    def write(self, text: str) -> int:
        self.tail.append(text)
        self.size += len(text)
        while self.size > self.limit and len(self.tail) > 1:
            self.size -= len(self.tail.popleft())
        return self.stream.write(text)

    def last_line(self) -> str:
        lines = [ln.strip() for ln in "".join(self.tail).splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""

    def __getattr__(self, name):
        return getattr(self.stream, name)


class ScriptRun:
    """One run of the script: argv, folder, stdin and stderr set for it; `run` returns how it ended:
    ("stopped", ScriptStop) | ("exit", code) | ("ended", None) | ("raised", exception)."""

    def __init__(self, path: Path, argv: list[str], cwd: Path, mirror: Mirror | None = None):
        self.path, self.argv, self.cwd, self.mirror = path, argv, cwd, mirror
        self.output = OutputTail(sys.stderr)
        self.started = time.perf_counter()

    def run(self) -> tuple[str, Any]:
        saved = (list(sys.argv), list(sys.path), os.getcwd(), sys.stderr)
        sys.argv = [str(self.path), *self.argv]
        sys.path.insert(0, str(self.path.parent))  # as `python train.py` puts the script's folder first
        os.chdir(self.cwd)
        sys.stderr = self.output
        try:
            with self.mirror or contextlib.nullcontext():
                runpy.run_path(str(self.path), run_name="__main__")
        except ScriptStop as stop:
            return "stopped", stop
        except SystemExit as exc:
            return "exit", exc.code
        except Exception as exc:  # noqa: BLE001 — the script's own failure is an outcome
            return "raised", exc
        finally:
            sys.argv[:], sys.path[:] = saved[0], saved[1]
            os.chdir(saved[2])
            sys.stderr = saved[3]
        return "ended", None


def working_folder(script: dict[str, Any]) -> tuple[Path, Mirror | None]:
    """Where the script runs: the folder the user named (`cwd`), else a new one in the probe's temporary folder
    (the runner removes it with the probe), mirroring the caller's folder (`home`) when the spec names one that
    this machine has (a Ray worker on another node may not)."""
    if script.get("cwd"):
        return Path(script["cwd"]), None
    root = Path(tempfile.mkdtemp(prefix="script-cwd-", dir=os.environ.get("TMPDIR") or None))
    home = Path(script["home"]) if script.get("home") else None
    return root, Mirror(home, root) if home is not None and home.is_dir() else None


def writes(mirror: Mirror | None) -> dict[str, Any]:
    """What the script wrote in its mirrored folder, for results.json (none: no mirror)."""
    return {"wrote": mirror.wrote, "wrote_count": mirror.count} if mirror is not None else {}


# --- a probe --------------------------------------------------------------------------------------------------


class Steps:
    """The step hook's side of a probe: warm-up steps, then measured ones (raw figures) until the StopRule says
    done, when it raises ScriptStop("done"). Each optimizer step is a step (a script's accumulation is its own)."""

    def __init__(self, spec: ProbeSpec, out: dict[str, Any], phase: Callable[[str], None], device_type: str,
                 rank=None):
        self.spec, self.out, self.raw, self.phase, self.device_type = spec, out, out["raw"], phase, device_type
        # A torchrun rank (distributed/rank.py ScriptRank): ranks must stop at the same optimizer step, or one
        # would wait in the next gradient all-reduce for the others forever; rank 0 decides for all.
        self.rank = rank
        self.hooks: Hooks | None = None
        # A script without a DataLoader whose batch size a flag sets (--map): each backward() is that many samples.
        self.flag_batch: int | None = None
        self.steps = 0  # optimizer steps ended
        self.warm: WarmUp | None = None  # from the first step on
        self.workers = 0  # the training loader's
        self.last: float | None = None
        self.stop: StopRule | None = None
        self.window = Window(spec.device, lambda: (self.hooks.fetch_wall_s, self.hooks.fetch_cpu_s))
        self.epoch_starts: list[int] = []
        self.unit_items: bool | None = None  # counting samples (a DataLoader fed the steps) or steps
        # A lockstep side (probe/lockstep.py): its warm-up waits for its turn, each measured step for the baton.
        self.baton = lockstep.baton(spec)
        self.begun = False
        # When a step ends (probe/device_clock.py): on a GPU, CUDA events at each optimizer step read a few steps
        # late, never a per-step synchronize, so the script's host runs ahead as it does alone; DDP ranks keep the
        # host clock. Chosen at the first step, when the script has set CUDA up (or not).
        self.clock = None
        self.in_flight: dict[int, tuple] = {}  # step -> (data wait, items, new epoch) until the device has run it

    def before_train_iter(self, loader) -> None:
        """Before the training loader starts (its workers too): a lockstep side's turn to warm up, as in
        probe/training.py; its epoch length goes to the parent."""
        if self.baton.active and not self.begun:
            workers = getattr(loader, "num_workers", 0) or 0
            try:
                epoch_steps = len(loader) if workers > 0 else None
            except TypeError:
                epoch_steps = None
            self._baton(self.baton.begin, epoch_steps, 1, self._in_flight())
            self.begun = True

    def _in_flight(self) -> int:
        """Steps a lockstep side will leave in flight inside its turn (its "ready"): one on a GPU."""
        return device_clock.LOCKSTEP_LAG if self.device_type == "cuda" and self.rank is None else 0

    def _clock(self):
        if self.clock is None:
            cuda = self.device_type == "cuda" and torch.cuda.is_initialized()
            self.clock = device_clock.for_probe("cuda" if cuda else "cpu", torch.cuda if cuda else None,
                                                host_paced=self.rank is not None, lockstep=self.baton.active)
        return self.clock

    def _loss(self, clock):
        """The step's loss: for CUDA events the tensor itself, read once the device has run the step (reading it
        now would wait for the GPU); else its value now (`read_loss`)."""
        if clock.name != device_clock.DEVICE:
            return self.hooks.read_loss()
        loss, self.hooks.loss = self.hooks.loss, None
        return loss

    def _ended(self, finished: list) -> None:
        """Steps the device has run: the loss checked, a measured step's figures recorded (`in_flight`)."""
        for done in finished:
            if done.loss is not None and not math.isfinite(done.loss):
                self.raw["loss"].append(None)  # JSON has no NaN: kept as null, the probe's loss not finite
                self.raw["loss_step"].append(done.step)
                raise ScriptStop("diverged", f"loss became {done.loss} at optimizer step {done.step + 1}")
            if done.step in self.in_flight:
                wait, items, new_epoch = self.in_flight.pop(done.step)
                add_outside_step(self.raw, self.epoch_starts, done.seconds, wait, items, done.loss, done.step,
                                 new_epoch)

    def flush(self) -> None:
        """The measured steps still on the device, recorded: the window is over."""
        if self.clock is not None:
            self._ended(self.clock.flush())

    def _baton(self, call, *args):
        """A baton call; its failure (the partner or the parent gone) ends the script past its own excepts."""
        try:
            return call(*args)
        except lockstep.LockstepError as exc:
            raise ScriptStop("lockstep", str(exc)) from None

    def __call__(self, optimizer) -> None:
        if self.window.spent is not None:  # the script caught the stop (a bare except) and trained on: again
            raise ScriptStop("done")
        clock, hooks = self._clock(), self.hooks
        loss = self._loss(clock)
        t0 = self.last if self.last is not None else time.perf_counter()
        # warm-up steps (and a lockstep turn's last) end at once: their end event waited for, never the device's
        finished = clock.end(self.steps, loss, t0, sync=self.stop is None or self.baton.last)
        if self.stop is None:
            self._ended(finished)
        now = time.perf_counter()
        self.steps += 1
        wait, items, new_epoch, backwards = hooks.take_step_input()
        if not items and self.flag_batch:
            items = float(self.flag_batch * max(backwards, 1))
        if self.warm is None:
            if self.rank is not None and not self.rank.joined():
                raise ScriptStop("refused", alone(self.rank.world_size))
            self._first_step()
            if self.baton.active and not self.begun:  # no training loader: its turn now
                self._baton(self.baton.begin, None, 1, self._in_flight())
                self.begun = True
        if self.stop is None:  # warming up
            if self.last is not None:
                self.warm.step_s.append(now - self.last)
            over = self.warm.over(self.steps)
            if self.rank is not None:
                over = self.rank.agree(over)
                now = time.perf_counter()  # the agreement is no step's time
            self.last = now
            if over:
                self._begin()
                self._next_turn()
            else:
                self.phase(f"script: warm-up, optimizer step {self.steps} done")
            return
        raw = self.raw
        if self.unit_items is None:
            self.unit_items = items > 0
            self.out["unit"] = "samples/s" if self.unit_items else "steps/s"
        self.in_flight[self.steps - 1] = (wait, items if self.unit_items else 1.0, new_epoch)
        ended = len(raw["step_s"])
        self._ended(finished)  # the steps the device has run by now: on a GPU, this one LAG steps later
        self.last = t0 + raw["step_s"][-1] if clock.lag == 0 else now  # the host clock: where this step ended
        if self.baton.active:  # the parent decides when both sides of the pair stop
            self._baton(self.baton.hand_over, list(zip(raw["step_s"][ended:], raw["items"][ended:])))
            self._next_turn()
            return
        done = self.stop.done(raw["step_s"], self.window.elapsed(now))
        if self.rank is not None:
            done = self.rank.agree(done)
            self.last = time.perf_counter()
        if done:
            self.flush()
            self.window.close(self.window.elapsed(now))
            raise ScriptStop("done")

    def _next_turn(self) -> None:
        """A lockstep side waits for the baton before its next measured step, which starts when it comes; a stop
        instead ends the script."""
        if not self.baton.active:
            return
        if not self._baton(self.baton.wait):
            self.flush()
            self.window.close(self.window.elapsed() - self.baton.idle_s)
            raise ScriptStop("done")
        self._clock().begin()  # on a GPU the step's device time starts with its baton
        self.last = time.perf_counter()

    def _first_step(self) -> None:
        loader = self.hooks.train_loader
        self.workers = getattr(loader, "num_workers", 0) or 0
        prefetch = getattr(loader, "prefetch_factor", None) or 0
        compile_stats = CompileStats() if self.hooks.applied.get("compile") else None
        # at least one warm-up step: the first step's end starts the clock
        self.warm = WarmUp(self.spec.protocol.warmup_steps, self.workers, prefetch, compile_stats, minimum=1)

    def _begin(self) -> None:
        loader = self.hooks.train_loader
        epoch_steps = None
        if self.workers > 0 and loader is not None:
            try:
                epoch_steps = len(loader) or None
            except TypeError:
                epoch_steps = None
        self.epoch_steps = epoch_steps
        self.stop = StopRule(self.spec.protocol, self.workers, epoch_steps)
        self.warm.done(self.out["extra"], self.steps, sum(self.warm.step_s))
        self.last = self.window.open()  # the first measured step starts here
        self.phase("script: measuring optimizer steps")


def train(spec: ProbeSpec, phase: Callable[[str], None], out: dict[str, Any], workdir: Path | None = None,
          rank=None) -> None:
    """Run the script under `spec.settings` and fill the result `out`, its status and error included (a failure of
    the script is a status here, not a raise: it needs the script's own words). `rank`: this process's torchrun
    rank in a DDP probe (distributed/rank.py ScriptRank), whose group the script itself initialises."""
    script, settings, path = spec.script, spec.settings, Path(spec.workload)
    device_type = torch.device(spec.device).type
    maps = flags.maps_from_json(script.get("map"))
    argv = flags.script_argv(script.get("args") or [], maps, settings, script.get("baseline") or {})
    cwd, mirror = working_folder(script)
    out["unit"] = "samples/s"
    mapped = {k for k in maps if k in settings}
    if not {"matmul_precision", "cudnn_benchmark"} & mapped:
        apply.configure_backends(settings, device_type)  # global switches; the script may still set its own
    torch.manual_seed(spec.seed)
    steps = Steps(spec, out, phase, device_type, rank)
    hooks = steps.hooks = Hooks(path, settings, device_type, apply_knobs=True, mapped=mapped,
                                train_site=script.get("loader_site"), on_step=steps)
    hooks.group = group_mod.GroupHooks(settings, device_type, True, mapped, rank.world_size if rank else 1,
                                       script.get("baseline"), up_front=bool(script.get("torchrun_env")))
    hooks.before_train_iter = steps.before_train_iter
    if "batch_size" in maps and not script.get("loader_site"):
        steps.flag_batch = int(settings["batch_size"])
    phase(f"script: running it, {BEFORE_FIRST_STEP}")
    run = ScriptRun(path, argv, cwd, mirror)
    try:
        how, what = _run_hooked(run, hooks)
    finally:
        # Ended by itself (or failed): its measured steps so far, the ones still on the device too, are the window.
        with contextlib.suppress(ScriptStop, RuntimeError):  # a failed script's device may not answer
            steps.flush()
        steps.window.close(sum(out["raw"]["step_s"]))
    out["extra"]["script"] = {"argv": argv, "cwd": str(cwd), "optimizer_steps": steps.steps,
                              "ended": _ending(how, what), **writes(mirror), **_group_facts(hooks.group)}
    if rank is not None and hooks.group.ddp:
        rank.wrapped(hooks.group.ddp["applied"])
    out["applied"].update(hooks.applied)
    problem = _problem(how, what, steps.steps, hooks, run, path, settings)
    if problem is None and how != "stopped" and len(out["raw"]["step_s"]) < MIN_MEASURED_STEPS:
        measured, warmup = len(out["raw"]["step_s"]), steps.warm.target if steps.warm else 0
        problem = (Status.ERROR, f"the script {_ending(how, what)} after {steps.steps} optimizer steps, "
                                 f"{measured} of them measured (after {warmup} warm-up steps); a probe "
                                 f"needs at least {MIN_MEASURED_STEPS}: let it train longer (the arguments after --)")
    if problem is not None:
        out["status"], out["error"] = problem[0].value, problem[1]
        return
    if not out["raw"]["step_s"]:  # a lockstep side stopped before its first measured step (the runner says so)
        return
    _record(out, steps, hooks)


def _group_facts(group: group_mod.GroupHooks) -> dict[str, Any]:
    """The script's own process group and DDP wrapper for results.json (nothing for a script without one)."""
    facts = group.facts()
    return {k: v for k, v in facts.items() if v}


def _ending(how: str, what: Any) -> str:
    if how == "stopped":
        return "was stopped after its measured steps" if what.kind == "done" else f"was stopped ({what.kind})"
    if how == "exit":
        return f"exited (sys.exit({what!r}))"
    if how == "raised":
        return f"raised {type(what).__name__}"
    return "ended"


def _problem(how: str, what: Any, steps: int, hooks: Hooks, run: ScriptRun, path: Path,
             settings: dict[str, Any]) -> tuple[Status, str] | None:
    """How the run failed (status, one-line cause), or None when it measured."""
    if how == "stopped":
        if what.kind == "diverged":
            return Status.DIVERGED, what.message
        if what.kind == "refused":
            return Status.ERROR, f"the script cannot be measured: {what.message}"
        if what.kind == "lockstep":  # the pair ended under it: its partner failed (probe/lockstep.py names it)
            return Status.STOPPED, f"stopped: {lockstep.PARTNER_ENDED} ({what.message})"
        return None
    if how == "raised":
        status, message = failure.classify(what, path, settings)
        if hooks.stdin.read_from and isinstance(what, EOFError):
            message = "it read from stdin, which a probe closes (it got end-of-file at once): " + message
        return status, (message if steps else f"{BEFORE_FIRST_STEP}: {message}")
    if steps == 0:
        return Status.ERROR, _no_step_cause(how, what, hooks, run)
    return None


def _no_step_cause(how: str, what: Any, hooks: Hooks, run: ScriptRun) -> str:
    seconds = time.perf_counter() - run.started
    said = f"; its last output: {run.output.last_line()!r}" if run.output.last_line() else ""
    stdin = "; it read from stdin, which a probe closes (end-of-file at once)" if hooks.stdin.read_from else ""
    if how == "exit" and what not in (None, 0):
        return f"the script exited with sys.exit({what!r}) {BEFORE_FIRST_STEP}{stdin}{said}"
    loaders = f", built {len(hooks.loaders)} DataLoader(s)" if hooks.loaders else ""
    return (f"the script ended after {seconds:.1f} s without calling optimizer.step(){loaders}{stdin}: nothing "
            f"trained{said}")


def _record(out: dict[str, Any], steps: Steps, hooks: Hooks) -> None:
    """The measured window (probe/measure.py) and what the training loader and the global switches were."""
    shapes = {s for s in hooks.shapes if s is not None}
    measured = Measurement(steps.window.spent, steps.workers, hooks.epochs, steps.epoch_steps, steps.epoch_starts,
                           len(shapes))
    record(out, measured, steps.window, steps.warm, out["applied"].get("compile", "default"), steps.baton.report())
    out["extra"]["step_clock"] = steps.clock.name if steps.clock is not None else device_clock.HOST
    loader = hooks.train_loader
    out["applied"].update({
        "loader_workers": getattr(loader, "num_workers", None),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    })
    skipped = "skipped: script mode (the tool does not drive the script's steps)"
    out["extra"]["collectors"] = {"nvml": steps.window.sampler.status, "flops": skipped, "profiler": skipped}


# --- inspect mode ---------------------------------------------------------------------------------------------


def inspect(spec: ProbeSpec, phase: Callable[[str], None]) -> dict[str, Any]:
    """Run the script as it is to INSPECT_STEPS optimizer steps; report its facts and the settings it uses, or a
    load_error (cause, fix, line) saying what was seen and what to do."""
    script, path = spec.script, Path(spec.workload)
    device_type = torch.device(spec.device).type
    maps = flags.maps_from_json(script.get("map"))
    world_size = int(script.get("world_size") or 1)  # the ranks of its probes; it is inspected as one process
    hooks, run, how, what, seen, mirror = _inspect_run(spec, phase, maps, torchrun_env=False)
    if how == "raised" and not seen and group_mod.reads_torchrun_env(what):
        # Written for torchrun: it reads RANK or LOCAL_RANK itself. Run as `torchrun --nproc-per-node 1` would.
        hooks, run, how, what, seen, mirror = _inspect_run(spec, phase, maps, torchrun_env=True)
    if how == "stopped" and what.kind == "refused":
        return _load_error(f"the script cannot be measured: {what.message}",
                           "script mode measures training in one process: run the training in this process (e.g. "
                           "a single-process option of the script), or write a build_model() workload (SPEC §2)")
    if how == "raised" and not seen:
        line, _ = wl_mod.user_frame(what, path)
        summary = wl_mod.exception_summary(what)
        if hooks.stdin.read_from and isinstance(what, EOFError):
            return _load_error(f"the script read from stdin {BEFORE_FIRST_STEP} and got end-of-file (a probe has "
                               f"no input): {summary}", "pass its input as an argument or a file (after --)", line)
        return _load_error(f"the script raised {summary} {BEFORE_FIRST_STEP}{_where_it_ran(what, script)}",
                           f"run `{_own_command(path, run.argv, script)}` on its own and fix the error", line)
    if not seen:
        return _load_error(_no_step_cause(how, what, hooks, run),
                           "script mode times each optimizer.step(): pass the arguments that make it train after "
                           "--, e.g. `tune-advisor analyze train.py -- --epochs 1`" if how != "exit" else
                           "pass the arguments it needs after -- (e.g. `-- --epochs 1`), and check it runs on its "
                           "own with them")
    if world_size > 1 and hooks.group.group is None:
        return _load_error(f"the script cannot be measured under --nproc-per-node {world_size}: "
                           f"{alone(world_size)}",
                           "initialise the group in the script as under torchrun (dist.init_process_group() and "
                           "DistributedDataParallel), or analyse it without --nproc-per-node")
    facts, script_facts, baseline = _facts(hooks, device_type, len(seen))
    script_facts.update(writes(mirror))
    script_facts.update(_group_facts(hooks.group))
    if world_size > 1:  # the DDP knobs apply to DDP probes only: their baseline is the script's own
        baseline.update(group_mod.baseline(hooks.group.facts()))
    if hooks.train_loader is None and "batch_size" in maps:
        given = maps["batch_size"].value_in(list(script.get("args") or []))
        if given is None:
            return _load_error(f"the script builds no DataLoader, so its batch size is the flag mapped to "
                               f"batch_size ({maps['batch_size'].flag}), and its arguments do not give it",
                               f"pass its batch size after -- as the script takes it (e.g. "
                               f"{' '.join(maps['batch_size'].argv(knobs.KNOBS['batch_size'].default))}), so the "
                               "baseline is what you run")
        baseline["batch_size"] = given
        script_facts["batch_size_from"] = {"flag": maps["batch_size"].flag, "value": given}
    return {"status": "ok", "facts": facts, "baseline": baseline, "search": flags.search_values(maps),
            "item_name": "samples" if hooks.train_loader is not None or "batch_size" in baseline else "steps",
            "optional": [],
            "script": script_facts}


def _inspect_run(spec: ProbeSpec, phase: Callable[[str], None], maps: dict[str, flags.FlagMap], torchrun_env: bool):
    """One run of the script to INSPECT_STEPS optimizer steps, observed: (hooks, run, how, what, step times, mirror).
    `torchrun_env`: torchrun's variables for a world of one set before it starts."""
    seen: list[float] = []

    def on_step(optimizer):
        seen.append(time.perf_counter())
        phase(f"script: {len(seen)} optimizer steps done")
        if len(seen) >= INSPECT_STEPS:
            raise ScriptStop("done")

    path, device_type = Path(spec.workload), torch.device(spec.device).type
    hooks = Hooks(path, spec.settings, device_type, apply_knobs=False, mapped=set(maps), train_site=None,
                  on_step=on_step)
    hooks.group = group_mod.GroupHooks(spec.settings, device_type, False, set(maps), 1, up_front=torchrun_env)
    phase(f"script: running it, {BEFORE_FIRST_STEP}")
    cwd, mirror = working_folder(spec.script)
    run = ScriptRun(path, list(spec.script.get("args") or []), cwd, mirror)
    how, what = _run_hooked(run, hooks)
    return hooks, run, how, what, seen, mirror


def _run_hooked(run: ScriptRun, hooks: Hooks) -> tuple[str, Any]:
    """`run.run()` with `hooks` (and their process-group patches) in; they come out whatever happens."""
    hooks.install()
    try:
        return run.run()
    finally:
        hooks.remove()
        hooks.group.close()


def _where_it_ran(exc: BaseException, script: dict[str, Any]) -> str:
    """For a file not found: the folder a relative path was read from."""
    if not isinstance(exc, FileNotFoundError):
        return ""
    if script.get("cwd"):
        return f" (it ran in {script['cwd']}, the --script-cwd folder)"
    if script.get("home"):
        return f" (relative paths are read from {script['home']}, where tune-advisor ran)"
    return " (it ran in an empty scratch folder)"


def _own_command(path: Path, argv: list[str], script: dict[str, Any]) -> str:
    """The command that reproduces the failure on its own: as run from where tune-advisor ran (the script's path
    relative to it when inside), or from the --script-cwd folder."""
    home = script.get("home")
    shown = os.path.relpath(path, home) if home and Path(path).is_relative_to(home) else str(path)
    command = shlex.join(["python", shown, *argv])
    return f"cd {shlex.quote(str(script['cwd']))} && {command}" if script.get("cwd") else command


def _load_error(cause: str, fix: str, line: int | None = None) -> dict[str, Any]:
    return {"status": "load_error", "error": {"cause": cause, "fix": fix, "line": line}}


def _facts(hooks: Hooks, device_type: str, steps: int) -> tuple[dict, dict, dict]:
    """(WorkloadFacts fields, what script mode saw, the script's own settings as knob values)."""
    loader = hooks.loader_facts
    model = hooks.model_facts
    script_facts = {
        "optimizers": len(hooks.stepped), "optimizers_built": len(hooks.optimizers),
        "model_found": hooks.model is not None, "own_autocast": hooks.own_autocast,
        "own_compile": hooks.own_compile, "loader": loader, "loaders_built": len(hooks.loaders),
        "inspected_steps": steps, "mapped": sorted(hooks.mapped),
    }
    facts = {
        "model_class": model.get("model_class", ""), "parameters": model.get("parameters", 0),
        "conv_layers": model.get("conv_layers", 0), "repeated_blocks": model.get("repeated_blocks"),
        "hf_checkpointing": model.get("hf_checkpointing", False),
        "iterable_dataset": bool(loader and loader["iterable_dataset"]),
        "dataset_len": loader["dataset_len"] if loader else None,
        "batch_kind": wl_mod.batch_kind(hooks.first_batch) if hooks.first_batch is not None else "",
        "optimizer_class": model.get("optimizer_class", ""), "optimizer_impls": [],
        "extra": {"script": script_facts},
    }
    baseline: dict[str, Any] = {}
    if loader:
        if not loader["batch_sampler"] and isinstance(loader["batch_size"], int):
            baseline["batch_size"] = loader["batch_size"]
        elif hooks.first_batch is not None:  # a batch_sampler decides: the batch it gave
            tensor = apply.first_tensor(hooks.first_batch)
            if tensor is not None and tensor.dim() > 0:
                baseline["batch_size"] = int(tensor.shape[0])
        baseline["num_workers"] = int(loader["num_workers"])
        baseline["pin_memory"] = bool(loader["pin_memory"]) and device_type == "cuda"
        if loader["num_workers"] > 0:
            baseline["prefetch_factor"] = int(loader["prefetch_factor"] or 2)
            baseline["persistent_workers"] = bool(loader["persistent_workers"])
    return facts, script_facts, baseline
