"""What both adapters share: the Adapted parts, the probe their own loops report to (LoopProbe, Loop), the
framework's optimizer step (accumulation and clipping), the framework import with its install hint, the effective
batch kept through gradient accumulation when the batch size changes, and values written as the user writes them."""

from __future__ import annotations

import enum
import json
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from ..errors import WorkloadError


@dataclass(frozen=True)
class OptimizerStep:
    """How the framework's own loop steps the optimizer, so that a probe's step costs what the user's does: once
    per `accumulate` micro-batches of the user's `batch_size` (the loss divided by that count before backward),
    after clipping the gradients (`clip` "norm": their total norm to `clip_value`; "value": each element; no
    clipping when `clip_value` is None)."""

    batch_size: int
    accumulate: int = 1
    clip_value: float | None = None
    clip: str = "norm"

    def every(self, batch_size: int) -> int:
        """Micro-batches per optimizer step at `batch_size`: those that keep the user's effective batch, as the
        recommendation writes them (`accumulation`)."""
        return accumulation(self.batch_size, self.accumulate, batch_size)[0]


class LoopProbe(Protocol):
    """The measuring side of a probe, as the framework's own loop reports to it (probe/loop.py implements it)."""

    def started(self, loader: Any, cycle: int, per_step: int = 1) -> None:
        """The training loop is about to read its first batch from `loader`; `cycle`: steps per optimizer step;
        `per_step`: batches each step reads."""

    def step_ended(self, loss: float | None) -> bool:
        """A training step ended (its loss when the loop shows it); True: stop training now."""

    def optimizer_impl(self, optimizer: Any) -> Any:
        """The optimizer rebuilt with the probe's optimizer_impl (no framework argument holds it)."""

    def prepare_model(self, model: Any) -> dict[str, Any]:
        """The model knobs no framework argument holds (channels_last, checkpointing) applied; their evidence."""


@dataclass(frozen=True)
class Loop:
    """The framework's own training loop, run for a probe: `run(settings, device, probe, scratch)` trains with the
    settings applied as the framework's arguments until `probe.step_ended` says stop, the framework's output (logs,
    checkpoints) in `scratch`, and returns what it set (the result's `applied`). `first_step(device)`, where set:
    one step of that loop as the user's settings run it, inspection's check that the object trains (where a step
    by hand outside the loop cannot run: a module that reads its Trainer)."""

    run: Callable[[dict[str, Any], str, LoopProbe, Path], dict[str, Any]]
    first_step: Callable[[str], None] | None = None


@dataclass
class Adapted:
    """What a framework object gives the engine: the plain workload's functions and the user's settings.

    `baseline` holds knob values read from the framework's configuration; `config` the framework's own settings
    as the user wrote them (saved in results.json `workload.framework`, read by the report's recommendation).
    """

    framework: str
    build_model: Callable
    build_dataset: Callable
    compute_loss: Callable
    build_optimizer: Callable | None
    collate_fn: Callable | None
    count_items: Callable | None
    item_name: str
    baseline: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    optimizer_step: OptimizerStep | None = None  # None: one optimizer step per batch, no clipping
    loop: Loop | None = None  # the framework's own loop, which probes measure


def require(name: str, extra: str, shown: str, entry: str):
    """Import the framework module `name`; not installed → a WorkloadError naming the extra to install."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise WorkloadError(shown, f"it defines {entry}(), which needs the '{name}' package, and it is not "
                                   "installed", f"pip install 'tune-advisor[{extra}]' (or pip install {name})"
                            ) from None


def accumulation(old_batch: int, old_accum: int, new_batch: int) -> tuple[int, bool]:
    """(accumulation steps at `new_batch`, whether they keep the effective batch old_batch x old_accum exactly)."""
    effective = old_batch * max(old_accum, 1)
    if effective % new_batch == 0:
        return effective // new_batch, True
    return max(1, round(effective / new_batch)), False


def accumulation_note(old_batch: int, old_accum: int, new_batch: int, setting: str) -> str:
    """The batch-size change in words: the accumulation that keeps the effective batch, or why none can."""
    accum, kept = accumulation(old_batch, old_accum, new_batch)
    effective = old_batch * max(old_accum, 1)
    head = f"batch size {old_batch} → {new_batch} per device"
    if kept:
        return (f"{head}, {setting} {old_accum} → {accum}: the effective batch stays {effective} "
                f"({new_batch} x {accum}), so the optimisation is unchanged (one optimizer step per {effective} "
                "samples).")
    new_effective = new_batch * accum
    ratio = new_effective / effective
    accumulate = f", {setting} {old_accum} → {accum}" if accum != old_accum else ""
    return (f"{head}{accumulate}: the effective batch changes from {effective} to {new_effective}, which changes "
            f"the optimisation; scale the learning rate about {ratio:.3g}x (linear rule) or {ratio ** 0.5:.3g}x "
            "(square root, Adam-style) and re-check convergence.")


def steps(value: Any) -> int:
    """An accumulation step count read from the user's settings or a saved file: 1 unless a positive integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def literal(value: Any) -> str:
    """A Python literal as the user writes it in a call (strings in double quotes)."""
    value = plain(value)
    return json.dumps(value) if isinstance(value, str) else repr(value)


def plain(value: Any) -> Any:
    """A JSON-friendly value: enums (TrainingArguments' optim is one) as their value."""
    return value.value if isinstance(value, enum.Enum) else value
