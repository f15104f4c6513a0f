"""The LightningModule as inspection sees it: the step wrapper, training_step's loss, and the optimizer from
configure_optimizers (frameworks/lightning.py loads the module; probes run Lightning's own loop, lightning_loop.py)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import WorkloadError

FIX_LOSS = "return the loss tensor (or {'loss': loss}) from training_step()"


class LightningStep(torch.nn.Module):
    """The LightningModule as the engine trains it: forward(batch) is training_step(batch, i), so the knobs that
    act on the model (compile, checkpointing, channels_last) reach the whole step, as in Lightning's own loop."""

    def __init__(self, module: torch.nn.Module, source: str):
        super().__init__()
        self.module, self.source = module, source  # source: the workload file, named by errors
        self.step_line = line_in(type(module).training_step, source)
        self.batch_idx = 0
        self.user_class = type(module).__name__  # what the reports name (not this wrapper)

    def to(self, *args, **kwargs):
        self.module.to(*args, **kwargs)  # LightningModule.to also tracks the module's .device for its own code
        return self

    def forward(self, batch):
        out = self.module.training_step(batch, self.batch_idx)
        self.batch_idx += 1
        return out


def compute_loss(model: Any, batch: Any) -> torch.Tensor:
    """training_step's loss: its tensor, or the "loss" of the dict it returns."""
    out = model(batch)
    loss = out.get("loss") if isinstance(out, Mapping) else out
    if not isinstance(loss, torch.Tensor):
        returned = "None" if out is None else f"a {type(out).__name__}"
        step = _step_of(model)
        raise WorkloadError(step.source, f"training_step() returned {returned}, not a loss", FIX_LOSS,
                            line=step.step_line)
    return loss


def line_in(function: Any, source: str) -> int | None:
    """The line where `function` is defined, when that is in the workload file `source`."""
    try:
        _, start = inspect.getsourcelines(function)
        if Path(inspect.getsourcefile(function)).resolve() != Path(source).resolve():
            return None
    except (OSError, TypeError):
        return None
    return start


def _step_of(model: Any) -> LightningStep:
    """The LightningStep inside torch.compile's and DDP's wrappers."""
    while not isinstance(model, LightningStep):
        model = getattr(model, "_orig_mod", None) or model.module
    return model


def first_optimizer(lm: Any, shown: str) -> torch.optim.Optimizer:
    """The first optimizer configure_optimizers() returns, in any of Lightning's forms (inspection reads its class
    and implementations; a probe's Trainer uses them all)."""
    found = _optimizers(lm.configure_optimizers())
    if not found:
        raise WorkloadError(shown, "configure_optimizers() returns no optimizer",
                            "return an optimizer (or {'optimizer': ..., 'lr_scheduler': ...}) from "
                            "configure_optimizers()")
    return found[0]


def _optimizers(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, torch.optim.Optimizer):
        return [value]
    if isinstance(value, Mapping):
        return _optimizers(value.get("optimizer"))
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and isinstance(value[0], (list, tuple)):  # ([optimizers], [schedulers])
            return _optimizers(list(value[0]))
        return [o for item in value for o in _optimizers(item)]
    return []
