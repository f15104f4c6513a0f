"""Lightning's own loop run for a probe: a real `Trainer` built from the file's TRAINER_ARGS with the probe's settings
as its arguments (`precision=`, `benchmark=`, `accumulate_grad_batches=`), the training DataLoader rebuilt with the
probe's DataLoader arguments and handed to `Trainer.fit`, and a Callback that reports each batch's end to the probe
and stops training when the probe has its steps. Hooks, `self.log`, schedulers, manual optimization and several
optimizers work because the loop is Lightning's. lightning.py `arguments` (handed in by the adapter) is the one
table between knobs and Lightning. Imported in the probe child only.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, IterableDataset

from .. import knobs
from ..errors import WorkloadError
from .common import LoopProbe, OptimizerStep
from .lightning_step import FIX_LOSS, line_in

MAX_STEPS = 10 ** 9  # training runs until the probe stops it, over as many epochs as that takes
# What a probe sets whatever TRAINER_ARGS says: no logger and no checkpoints (they are not training steps), no
# validation (it would be timed inside the window), the output in the probe's scratch folder, one device.
PROBE_ARGS = {"logger": False, "enable_checkpointing": False, "num_sanity_val_steps": 0, "limit_val_batches": 0,
              "max_steps": MAX_STEPS, "max_epochs": -1, "devices": 1, "num_nodes": 1}
NOT_HERE = ("ddp_bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "ddp_backend")  # one process: no DDP


def settings_split(arguments: Callable, settings: Mapping[str, Any]
                   ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(Trainer arguments, DataLoader arguments, knobs only code sets) for `settings`."""
    trainer, loader, code = {}, {}, []
    for knob in knobs.KNOBS:
        if knob not in settings or knob in NOT_HERE:
            continue
        where, what = arguments(knob, settings[knob])
        if where == "code":
            code.append(knob)
        else:
            (trainer if where == "trainer" else loader).update(what)
    if settings["num_workers"] == 0:  # the worker-only arguments are refused without workers
        loader.pop("persistent_workers", None)
        loader.pop("prefetch_factor", None)
    return trainer, loader, code


def rebuilt_loader(original: DataLoader, changes: Mapping[str, Any], device_type: str) -> DataLoader:
    """The user's training DataLoader with the probe's arguments: same dataset, sampler, collate function and the
    rest of its arguments."""
    iterable = isinstance(original.dataset, IterableDataset)
    kwargs = {"batch_size": original.batch_size, "num_workers": original.num_workers, "pin_memory": original.pin_memory,
              "collate_fn": original.collate_fn, "drop_last": original.drop_last, "timeout": original.timeout,
              "worker_init_fn": original.worker_init_fn, "generator": original.generator,
              "multiprocessing_context": original.multiprocessing_context,
              "sampler": None if iterable else original.sampler, **changes}
    kwargs["pin_memory"] = bool(kwargs["pin_memory"]) and device_type == "cuda"
    if kwargs["num_workers"] > 0:
        kwargs.setdefault("persistent_workers", original.persistent_workers)
        kwargs.setdefault("prefetch_factor", original.prefetch_factor)
    return DataLoader(original.dataset, **kwargs)


def optimizers_rebuilt(lm: Any, probe: LoopProbe) -> None:
    """configure_optimizers() with each optimizer rebuilt in the probe's implementation, its schedulers pointed at
    the rebuilt one (no Trainer argument holds the implementation; built before any step, nothing to carry over)."""
    original = lm.configure_optimizers

    def configure():
        found = original()
        rebuilt: dict[int, Any] = {}
        _walk(found, lambda o: rebuilt.setdefault(id(o), probe.optimizer_impl(o)), torch.optim.Optimizer)
        _walk(found, lambda s: setattr(s, "optimizer", rebuilt.get(id(s.optimizer), s.optimizer)),
              torch.optim.lr_scheduler.LRScheduler)
        return _swap(found, rebuilt)

    lm.configure_optimizers = configure


def _walk(value: Any, visit, kind: type) -> None:
    if isinstance(value, kind):
        visit(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            _walk(item, visit, kind)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _walk(item, visit, kind)


def _swap(value: Any, rebuilt: dict[int, Any]) -> Any:
    if isinstance(value, torch.optim.Optimizer):
        return rebuilt.get(id(value), value)
    if isinstance(value, Mapping):
        return {k: _swap(v, rebuilt) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_swap(v, rebuilt) for v in value)
    return value


def _loss(outputs: Any) -> float | None:
    """training_step's loss as the batch-end hook sees it (automatic: {"loss": ...}; manual: what it returned)."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    return float(loss.detach()) if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


class FirstStep:
    """One step of Lightning's own loop under the user's TRAINER_ARGS (inspection's check), and the optimizers its
    Trainer built (configure_optimizers may need the Trainer: `self.trainer.estimated_stepping_batches`). With
    automatic optimization a training_step that returns no loss trains nothing (Lightning skips the step): refused."""

    def __init__(self, pl: Any, lm: Any, loader: DataLoader, trainer_args: Mapping[str, Any], shown: str):
        self.pl, self.lm, self.loader, self.trainer_args, self.shown = pl, lm, loader, trainer_args, shown
        self.optimizers: list = []

    def __call__(self, device: str) -> None:
        accelerator = "gpu" if torch.device(device).type == "cuda" else "cpu"
        scratch = tempfile.mkdtemp(prefix="lightning-first-step-")
        outputs: list = []

        class Outputs(self.pl.Callback):
            def on_train_batch_end(self, trainer, pl_module, out, batch, batch_idx):
                outputs.append(out)

        callbacks = [*(self.trainer_args.get("callbacks") or []), Outputs()]
        trainer = self.pl.Trainer(**{**self.trainer_args, **PROBE_ARGS, "max_steps": 1, "accelerator": accelerator,
                                     "default_root_dir": scratch, "enable_progress_bar": False,
                                     "enable_model_summary": False, "callbacks": callbacks})
        trainer.fit(self.lm, train_dataloaders=self.loader)
        self.optimizers = list(trainer.optimizers)
        if self.lm.automatic_optimization and (not outputs or _loss(outputs[0]) is None):
            line = line_in(type(self.lm).training_step, self.shown)
            raise WorkloadError(self.shown, "training_step() returned None, not a loss: Lightning skips the "
                                            "optimizer step, so nothing trains", FIX_LOSS, line=line)


def run(arguments: Callable, pl: Any, lm: Any, loader: DataLoader, trainer_args: Mapping[str, Any], rule: OptimizerStep,
        settings: dict[str, Any], device: str, probe: LoopProbe, scratch: Path) -> dict[str, Any]:
    """Trainer.fit for one probe (see common.Loop); `pl`: the Lightning package the module subclasses."""
    device_type = torch.device(device).type
    trainer_changes, loader_changes, code = settings_split(arguments, settings)
    automatic = bool(lm.automatic_optimization)
    cycle = rule.every(settings["batch_size"]) if automatic else 1  # manual optimization accumulates by itself
    if automatic:
        trainer_changes["accumulate_grad_batches"] = cycle

    class ProbeCallback(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            probe.started(train_loader, cycle)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if probe.step_ended(_loss(outputs)):
                trainer.should_stop = True

    train_loader = rebuilt_loader(loader, loader_changes, device_type)
    callbacks = list(trainer_args.get("callbacks") or [])
    accelerator = "gpu" if device_type == "cuda" else "cpu"
    trainer = pl.Trainer(**{**trainer_args, **trainer_changes, **PROBE_ARGS, "accelerator": accelerator,
                            "default_root_dir": str(scratch / "lightning"), "callbacks": [*callbacks, ProbeCallback()]})
    applied: dict[str, Any] = {"trainer_arguments": trainer_changes, "dataloader_arguments": loader_changes}
    if {"channels_last", "checkpointing"} & set(code):
        applied.update(probe.prepare_model(lm))
    if "optimizer_impl" in code:
        optimizers_rebuilt(lm, probe)
    model = lm if settings.get("compile", "off") == "off" else torch.compile(
        lm, **({} if settings["compile"] == "default" else {"mode": settings["compile"]}))
    trainer.fit(model, train_dataloaders=train_loader)
    return applied
