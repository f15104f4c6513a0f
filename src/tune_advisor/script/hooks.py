"""What script mode patches inside the probe child to observe and control a script from outside its code.

- `DataLoader.__init__`: records what the script asked for and, on its training loader, substitutes the loader
  knobs' values; `DataLoader.__iter__`: the training loader's iterator is timed (data wait) and its batches counted.
- `Optimizer.__init__`: finds the model (the outermost module holding the optimizer's parameters) and applies the
  model knobs to it: checkpointing, channels_last, autocast around its forward (channels_last inputs too), compile.
- a global optimizer step post-hook: each `optimizer.step()` ends a training step (`on_step`).
- `Tensor.backward`: the last scalar it was called on is the step's loss (for loss parity); the scalars it was
  called on between two steps are the step's micro-batches (a script without a DataLoader counts its samples so).
- `init_process_group`, `DistributedDataParallel` and `destroy_process_group`: the script's own group
  (script/group.py).
- `multiprocessing`'s `Process.start`, `subprocess.Popen` and `os.fork` called from the script's own code: refused
  before a process starts (script mode measures one process; DataLoader workers and torch's own processes are
  started by library code, and pass); `sys.stdin`: empty, and a read is noted.

Only inside the child (torch is imported there anyway); `Hooks.remove` puts everything back.
"""

from __future__ import annotations

import functools
import gc
import inspect
import io
import multiprocessing.process
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..probe import apply
from ..probe.evidence import sample_shape

LOADER_KNOBS = ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
MODEL_KNOBS = ("amp", "channels_last", "compile", "checkpointing")


class ScriptStop(BaseException):
    """Raised from a hook to end the script: `kind` "done" (the probe has its steps), "diverged", "refused" (it did
    something script mode cannot measure). A BaseException, so the script's own `except Exception` lets it pass."""

    def __init__(self, kind: str, message: str = ""):
        super().__init__(message or kind)
        self.kind, self.message = kind, message


class ClosedStdin(io.StringIO):
    """sys.stdin for the script: always at end-of-file, and it remembers being read."""

    def __init__(self):
        super().__init__("")
        self.read_from = False

    def read(self, *args):
        self.read_from = True
        return super().read(*args)

    def readline(self, *args):
        self.read_from = True
        return super().readline(*args)

    def readlines(self, *args):
        self.read_from = True
        return super().readlines(*args)

    def __iter__(self):
        self.read_from = True
        return super().__iter__()

    def isatty(self) -> bool:
        return False


class TimedIterator:
    """A DataLoader's iterator as the script sees it: the time spent waiting in `next` and the batches it handed
    out go to the hooks (which count only the training loader's)."""

    def __init__(self, inner, hooks: "Hooks", loader, record: dict[str, Any]):
        self._inner, self._hooks, self._loader, self._record = inner, hooks, loader, record

    def __iter__(self):
        return self

    def __next__(self):
        t0, cpu0 = time.perf_counter(), time.thread_time()
        batch = next(self._inner)
        self._hooks.batch_arrived(self._loader, self._record, batch, time.perf_counter() - t0,
                                  time.thread_time() - cpu0)
        return batch

    def __len__(self):
        return len(self._inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class Hooks:
    """The patches of one script run. `settings`: every knob; `apply`: substitute the knobs' values (False in
    inspect mode: observe only); `mapped`: knobs the script's own flags set (left alone here); `train_site`: where
    the script builds its training DataLoader (`file:line`, as the inspection found it: the loader whose batches
    fed the first optimizer step), None: not known yet, found at the first step; `on_step(optimizer)` is called
    after each optimizer step.

    The training loader is known by where it is built, not by order: a script that builds a new one every epoch
    builds each at the same line."""

    def __init__(self, script: Path, settings: Mapping[str, Any], device_type: str, apply_knobs: bool,
                 mapped: set[str], train_site: str | None, on_step: Callable[[Any], None]):
        self.script, self.settings, self.device_type = script, dict(settings), device_type
        self.apply, self.mapped, self.train_site, self.on_step = apply_knobs, mapped, train_site, on_step
        self.loaders: list[dict[str, Any]] = []  # each DataLoader built: what the script asked for, and where
        self.train_loader = None  # the latest training DataLoader
        self.loader_facts: dict[str, Any] | None = None  # what the script asked of the training loader
        self.last_fed: tuple[Any, dict[str, Any]] | None = None  # the loader that handed out a batch last
        self.epochs = 0  # iterators made from the training loader
        self.new_epoch = False  # one was made since the last step
        self.wait_s, self.items, self.batches = 0.0, 0.0, 0  # since the last step
        # The training loader's fetches so far: their wall time, and this thread's CPU time in them (as
        # probe/training.py's fetch_cpu_frac: a CPU-bound loader from one waiting on storage).
        self.fetch_wall_s = self.fetch_cpu_s = 0.0
        self.first_batch = None
        self.shapes: set = set()
        self.model = None
        self.model_facts: dict[str, Any] = {}
        self.applied: dict[str, Any] = {}
        self.optimizers: list[Any] = []  # built, in order
        self.stepped: list[int] = []  # ids of the optimizers that stepped, in first-step order
        self.own_autocast = False
        self.own_compile = False
        self.loss = None  # the last scalar backward() was called on
        self.backwards = 0  # scalars backward() was called on since the last step: micro-batches
        self.refused: str | None = None
        self.stdin = ClosedStdin()
        self._records: dict[int, dict[str, Any]] = {}  # id(DataLoader) -> its record
        self.before_train_iter: Callable[[Any], None] | None = None  # called before each training-loader iterator
        self.group = None  # script/group.py GroupHooks: the script's own process group and DDP wrapper
        self._undo: list[Callable[[], None]] = []

    # --- installing ------------------------------------------------------------------------------------------

    def install(self) -> "Hooks":
        global _watching
        _watching = self
        self._undo.append(_stop_watching)
        self._patch(DataLoader, "__init__", self._loader_init)
        self._patch(DataLoader, "__iter__", self._loader_iter)
        self._patch(torch.optim.Optimizer, "__init__", self._optimizer_init)
        self._patch(torch.Tensor, "backward", self._backward)
        self._patch(multiprocessing.process.BaseProcess, "start", self._guard_spawn("multiprocessing Process.start"))
        self._patch(subprocess.Popen, "__init__", self._guard_spawn("subprocess.Popen"))
        self._patch(os, "fork", self._guard_spawn("os.fork"))  # multiprocessing's fork goes through it too
        if self.group is not None:
            self.group.install(self._patch)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(self._stepped)
        self._undo.append(handle.remove)
        saved_stdin = sys.stdin
        sys.stdin = self.stdin
        self._undo.append(lambda: setattr(sys, "stdin", saved_stdin))
        return self

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner, name: str, make: Callable[[Callable], Callable]) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, functools.wraps(original)(make(original)))
        self._undo.append(lambda: setattr(owner, name, original))

    # --- the DataLoader ----------------------------------------------------------------------------------------

    def _loader_init(self, original):
        signature = inspect.signature(original)
        hooks = self

        def init(loader, *args, **kwargs):
            bound = signature.bind(loader, *args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            index = len(hooks.loaders)
            record = {"index": index, "site": construction_site() or f"#{index}",
                      "batch_size": a["batch_size"], "num_workers": a["num_workers"], "pin_memory": a["pin_memory"],
                      "prefetch_factor": a["prefetch_factor"], "persistent_workers": a["persistent_workers"],
                      "batch_sampler": a["batch_sampler"] is not None, "dataset": type(a["dataset"]).__name__,
                      "dataset_len": _safe_len(a["dataset"]),
                      "iterable_dataset": isinstance(a["dataset"], IterableDataset)}
            hooks.loaders.append(record)
            train = record["site"] == hooks.train_site
            if train and hooks.apply:
                hooks.applied["loader"] = hooks._substitute(a)
            original(*bound.args, **bound.kwargs)
            hooks._records[id(loader)] = record
            if train:
                hooks.train_loader, hooks.loader_facts = loader, record

        return init

    def _substitute(self, a: dict[str, Any]) -> dict[str, Any]:
        """The loader knobs' values put into the DataLoader's arguments `a` (the mapped ones are the script's own).
        Returns what the loader was built with."""
        s, free = self.settings, [k for k in LOADER_KNOBS if k not in self.mapped]
        if "batch_size" in free and a["batch_sampler"] is None and a["batch_size"] is not None:
            a["batch_size"] = s["batch_size"]
        if "num_workers" in free:
            a["num_workers"] = s["num_workers"]
        if "pin_memory" in free:
            a["pin_memory"] = bool(s["pin_memory"]) and self.device_type == "cuda"
        if a["num_workers"] > 0:
            if "prefetch_factor" in free:
                a["prefetch_factor"] = s["prefetch_factor"]
            if "persistent_workers" in free:
                a["persistent_workers"] = bool(s["persistent_workers"])
        else:  # the DataLoader refuses these without workers
            a["prefetch_factor"], a["persistent_workers"] = None, False
        return {k: a[k] for k in LOADER_KNOBS}

    def _loader_iter(self, original):
        hooks = self

        def iter_(loader):
            record = hooks._records.get(id(loader))
            train = record is not None and hooks.is_train(record)
            if train and hooks.before_train_iter is not None:
                hooks.before_train_iter(loader)  # a lockstep side waits for its turn before workers start
            inner = original(loader)
            if record is None:  # built before the hooks were installed
                return inner
            if train:
                hooks.epochs += 1
                hooks.new_epoch = True
            return TimedIterator(inner, hooks, loader, record)

        return iter_

    def is_train(self, record: dict[str, Any]) -> bool:
        """Whether the loader of `record` is the training loader (before the first step, not known: any loader)."""
        return self.train_site is None or record["site"] == self.train_site

    def batch_arrived(self, loader, record: dict[str, Any], batch, waited_s: float, cpu_s: float = 0.0) -> None:
        self.last_fed = (loader, record)
        if not self.is_train(record):
            return  # an evaluation loader's batches are not training samples
        self.fetch_wall_s += waited_s
        self.fetch_cpu_s += cpu_s
        tensor = apply.first_tensor(batch)
        self.items += float(tensor.shape[0]) if tensor is not None and tensor.dim() > 0 else 1.0
        self.wait_s += waited_s
        self.batches += 1
        if self.first_batch is None:
            self.first_batch = batch
        if len(self.shapes) < 64:
            self.shapes.add(sample_shape(batch))

    def take_step_input(self) -> tuple[float, float, bool, int]:
        """(data wait seconds, samples, began an epoch, micro-batches through backward()) since the last step, then
        reset."""
        taken = (self.wait_s, self.items, self.new_epoch, self.backwards)
        self.wait_s, self.items, self.batches, self.new_epoch, self.backwards = 0.0, 0.0, 0, False, 0
        return taken

    # --- the optimizer and the model ---------------------------------------------------------------------------

    def _optimizer_init(self, original):
        hooks = self

        def init(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            hooks.optimizers.append(optimizer)
            if hooks.model is None and len(hooks.optimizers) == 1:
                hooks._found_model(optimizer)

        return init

    def _found_model(self, optimizer) -> None:
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        model = outermost_module(params)
        if model is None:
            return
        self.own_compile = type(model).__name__ == "OptimizedModule"  # the script compiled it itself
        self.model = model
        convs = sum(isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)) for m in model.modules())
        self.model_facts = {
            "model_class": type(_unwrapped(model)).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "conv_layers": convs,
            "repeated_blocks": apply.describe_repeated_blocks(model),
            "hf_checkpointing": bool(getattr(model, "supports_gradient_checkpointing", False)),
            "optimizer_class": type(optimizer).__name__,
        }
        self._wrap_model(model)

    def _wrap_model(self, model) -> None:
        """Apply the model knobs that are not mapped to flags. Its forward hooks also note the script's own
        autocast (then the amp knob cannot be applied from outside)."""
        s, free = self.settings, set(MODEL_KNOBS) - self.mapped
        apply_ = self.apply
        if apply_ and "checkpointing" in free and s["checkpointing"] and not self.own_compile:
            self.applied["checkpointing"] = apply.enable_checkpointing(model)
        channels_last = apply_ and "channels_last" in free and bool(s["channels_last"])
        if channels_last:
            model.to(memory_format=torch.channels_last)  # Parameter objects kept: the optimizer still holds them
        amp = s["amp"] if apply_ and "amp" in free else "off"
        around = ForwardHooks(amp, self.device_type, channels_last)
        # Module hooks, not a replaced forward: a script that deep-copies the model (an EMA copy) or pickles it
        # whole (torch.save(model)) gets a working copy, not one whose forward calls the original's.
        self._undo.append(model.register_forward_pre_hook(around.before).remove)
        self._undo.append(model.register_forward_hook(around.after, always_call=True).remove)
        self.applied.update({"model": self.model_facts.get("model_class"), "amp": amp,
                             "channels_last": channels_last})
        if apply_ and "compile" in free and s["compile"] != "off" and not self.own_compile:
            model.compile(mode=s["compile"])  # in place: the script keeps calling the same object
            self.applied["compile"] = s["compile"]

    def _backward(self, original):
        hooks = self

        def backward(tensor, *args, **kwargs):
            if tensor.numel() == 1:
                hooks.loss = tensor.detach()
                hooks.backwards += 1
            return original(tensor, *args, **kwargs)

        return backward

    def _stepped(self, optimizer, args, kwargs) -> None:
        if self.train_site is None and self.last_fed is not None:  # the first step: its batches' loader trains
            self.train_loader, self.loader_facts = self.last_fed
            self.train_site = self.loader_facts["site"]
        elif self.apply and self.train_loader is None and self.last_fed is not None and not self.stepped:
            # A probe whose script built its loader elsewhere than in the inspection: the loader knobs never
            # reached it, so its figures would be the script's own settings under another name.
            raise ScriptStop("refused", f"its training DataLoader was built at {self.last_fed[1]['site']}, not at "
                                        f"{self.train_site} as when it was inspected, so the loader knobs could "
                                        "not be set (do its arguments change where it builds the loader?)")
        if id(optimizer) not in self.stepped:
            self.stepped.append(id(optimizer))
        if id(optimizer) == self.stepped[0]:  # with several optimizers, the first one's steps are the steps
            self.on_step(optimizer)

    def read_loss(self) -> float | None:
        """The last loss as a float (None when no scalar went through backward()); then forgotten."""
        loss, self.loss = self.loss, None
        return float(loss.float().item()) if loss is not None else None

    # --- processes -----------------------------------------------------------------------------------------------

    def _guard_spawn(self, what: str):
        hooks = self

        def make(original):
            def guarded(*args, **kwargs):
                where = user_caller(hooks.script)
                if where is not None:
                    hooks.refused = f"it starts processes of its own ({what} at {where})"
                    raise ScriptStop("refused", hooks.refused)
                return original(*args, **kwargs)

            return guarded

        return make


_watching: Hooks | None = None  # the installed Hooks, told by ForwardHooks when the script autocasts itself


def _stop_watching() -> None:
    global _watching
    _watching = None


class ForwardHooks:
    """Around the model's forward: the amp knob's autocast entered before and left after (also when it raises),
    4-D float inputs made channels_last; an autocast already on before it (not ours) is the script's own.
    A module-level class, so a model pickled or deep-copied with its hooks stays usable."""

    def __init__(self, amp: str, device_type: str, channels_last: bool):
        self.amp, self.device_type, self.channels_last = amp, device_type, channels_last
        self.entered: list = []  # our autocast contexts of forwards still running (nested calls)

    # Run eagerly, outside a torch.compile'd model's trace: traced, the autocast's __enter__ became part of the
    # graph and never ran in Python, and __exit__ after it raised (AttributeError: no attribute 'prev'); entered
    # eagerly around the compiled forward, the autocast state is one the compiled graph is traced and guarded under.
    @torch.compiler.disable
    def before(self, module, args):
        if not self.entered and _watching is not None and torch.is_autocast_enabled(self.device_type):
            _watching.own_autocast = True
        if self.amp != "off":
            context = apply.autocast({"amp": self.amp}, self.device_type)
            context.__enter__()
            self.entered.append(context)
        if self.channels_last:
            return tuple(_channels_last(a) for a in args)
        return None

    @torch.compiler.disable
    def after(self, module, args, output):
        if self.entered:
            self.entered.pop().__exit__(None, None, None)
        return None

    def __getstate__(self):
        return {**self.__dict__, "entered": []}


def outermost_module(param_ids: set[int]):
    """The nn.Module holding the most of these parameters, the outermost of equals (the one with most modules)."""
    best, best_key = None, (0, 0)
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.nn.Module):  # type(): isinstance reads __class__, which some lazy
            continue  # module objects answer with a deprecation warning
        try:
            held = sum(1 for p in obj.parameters() if id(p) in param_ids)
        except Exception:  # a half-built module
            continue
        if held == 0:
            continue
        key = (held, sum(1 for _ in obj.modules()))
        if key > best_key:
            best, best_key = obj, key
    return best


_LIBRARY_ROOTS = tuple({str(Path(p).resolve()) for p in (sysconfig.get_paths()["stdlib"],
                                                          sysconfig.get_paths()["purelib"],
                                                          sysconfig.get_paths()["platlib"])})
_OWN_ROOT = str(Path(__file__).resolve().parents[1])


def user_caller(script: Path) -> str | None:
    """`file:line` of the nearest caller that is the user's code (not the standard library, an installed package
    or tune-advisor), when it is nearer than any library frame that called it; None when a library called."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<"):
            frame = frame.f_back
            continue
        resolved = os.path.realpath(name)
        if resolved.startswith(_OWN_ROOT) or resolved.startswith(_LIBRARY_ROOTS) or "site-packages" in resolved:
            if "multiprocessing" in resolved or resolved.endswith(("subprocess.py", "concurrent/futures/process.py")):
                frame = frame.f_back  # the machinery of the call itself: look further out
                continue
            return None
        return f"{Path(resolved).name}:{frame.f_lineno}"
    return None


def construction_site() -> str | None:
    """Where the script builds a DataLoader: the `file:line` of every caller in its own code (outside torch,
    tune-advisor and the standard library), nearest first, joined by " < " — a helper that builds both the training
    and the evaluation loader is told apart by its callers. None when no caller is the script's."""
    frame, lines = sys._getframe(2), []
    while frame is not None:
        name = frame.f_code.co_filename
        resolved = "" if name.startswith("<") else os.path.realpath(name)
        if resolved and not (resolved.startswith(_OWN_ROOT) or resolved.startswith(_LIBRARY_ROOTS)
                             or "site-packages" in resolved):
            lines.append(f"{Path(resolved).name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(lines) or None


def _unwrapped(model):
    """The user's model inside torch.compile's and DDP's wrappers (a script written for torchrun wraps it)."""
    model = getattr(model, "_orig_mod", model)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = getattr(model.module, "_orig_mod", model.module)
    return model


def _channels_last(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() == 4:
        return value.contiguous(memory_format=torch.channels_last)
    return value


def _safe_len(dataset) -> int | None:
    try:
        return len(dataset)
    except Exception:  # IterableDatasets often have no length
        return None
