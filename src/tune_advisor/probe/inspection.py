"""The probe child's inspect mode: load the workload, check that it builds and computes a loss, and report its
facts (or the load error, which the parent turns into exit code 2). Runs only inside the child."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, IterableDataset

from .. import workload as wl_mod
from ..errors import WorkloadError
from . import apply, evidence
from .spec import ProbeSpec
from .training import build_optimizer


def inspect_workload(spec: ProbeSpec, phase: Callable[[str], None]) -> dict[str, Any]:
    """Load the workload and report its facts, or the load error (the parent turns it into exit code 2)."""
    try:
        return {"status": "ok", **_inspect(spec, phase)}
    except WorkloadError as exc:
        return {"status": "load_error", "error": {"cause": exc.cause, "fix": exc.fix, "line": exc.line}}


def _inspect(spec: ProbeSpec, phase: Callable[[str], None]) -> dict[str, Any]:
    phase("importing the workload file")
    wl = wl_mod.load(spec.workload)
    shown = spec.workload
    model, dataset = _build(wl, shown, phase)
    facts = _facts(model, dataset)
    phase("reading the dataset's item sizes")
    facts["extra"] = {"longest_item": evidence.longest_item(dataset)}  # what the memory peaks must cover
    batch = _first_batch(wl, dataset, shown, phase)
    facts["batch_kind"] = wl_mod.batch_kind(batch)
    if wl.compute_loss is None and facts["batch_kind"] not in ("dict", "pair"):
        raise WorkloadError(shown, f"the batch is a {facts['batch_kind']}, which the default loss cannot handle",
                            wl_mod.BATCH_FIX)
    if wl.loop is not None and wl.loop.first_step is not None:  # a step that needs the framework's own loop
        _first_step(wl, spec.device, shown, phase)
    else:
        _first_loss(wl, model, batch, torch.device(spec.device), shown, phase)
    optimizer = _optimizer(wl, model, shown, phase)
    facts["optimizer_class"] = type(optimizer).__name__
    facts["optimizer_impls"] = apply.supported_optimizer_impls(optimizer)
    return {
        "facts": facts,
        "baseline": wl.baseline,
        "search": wl.search,
        "item_name": wl.item_name,
        "framework": wl.framework,
        "optional": [n for n in ("compute_loss", "build_optimizer", "collate_fn", "count_items")
                     if getattr(wl, n) is not None],
    }


def _build(wl, shown: str, phase: Callable[[str], None]) -> tuple[torch.nn.Module, Any]:
    """The workload's model and dataset, each checked to be what the contract asks for."""
    phase("building the model")
    model = wl.call("build_model")
    if not isinstance(model, torch.nn.Module):
        raise WorkloadError(shown, f"build_model() returned a {type(model).__name__}, not a torch.nn.Module",
                            "return the model instance from build_model()")
    phase("building the dataset")
    dataset = wl.call("build_dataset")
    if not (hasattr(dataset, "__getitem__") or hasattr(dataset, "__iter__")):
        raise WorkloadError(shown, f"build_dataset() returned a {type(dataset).__name__}, not a Dataset",
                            "return a torch.utils.data.Dataset (map-style or IterableDataset)")
    return model, dataset


def _facts(model: torch.nn.Module, dataset) -> dict[str, Any]:
    """What the model and dataset are, as the knobs' applicability reads them."""
    return {
        "model_class": getattr(model, "user_class", None) or type(model).__name__,  # a framework's wrapper: its
        # user's class
        "parameters": sum(p.numel() for p in model.parameters()),
        "conv_layers": sum(isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)) for m in model.modules()),
        "repeated_blocks": apply.describe_repeated_blocks(model),
        "hf_checkpointing": bool(getattr(model, "supports_gradient_checkpointing", False)),
        "iterable_dataset": isinstance(dataset, IterableDataset),
        "dataset_len": _safe_len(dataset),
    }


def _first_batch(wl, dataset, shown: str, phase: Callable[[str], None]):
    phase("reading a first batch of 2 samples")
    try:
        return next(iter(DataLoader(dataset, batch_size=2, collate_fn=wl.collate_fn)))
    except StopIteration:
        raise WorkloadError(shown, "the dataset yields no batch", "build_dataset() must return a non-empty dataset")
    except Exception as exc:
        line, _ = wl_mod.user_frame(exc, wl.path)
        raise WorkloadError(shown, f"reading a first batch raised {wl_mod.exception_summary(exc)}",
                            "check the dataset's __getitem__/__iter__ and collate_fn", line=line) from exc


def _first_loss(wl, model: torch.nn.Module, batch, device: torch.device, shown: str,
                phase: Callable[[str], None]) -> None:
    """The loss of the first batch on the device: it must compute, and be a scalar tensor."""
    phase("computing the loss on a first batch")
    model.to(device).train()
    loss_fn = wl.compute_loss or wl_mod.default_loss
    try:
        loss = loss_fn(model, apply.to_device(batch, device, False, False))
    except WorkloadError:  # a framework adapter's check (a training_step returning no loss)
        raise
    except wl_mod.BatchError as exc:
        raise WorkloadError(shown, str(exc), wl_mod.BATCH_FIX) from None
    except Exception as exc:
        line, _ = wl_mod.user_frame(exc, wl.path)
        raise WorkloadError(shown, f"computing the loss on a first batch of 2 raised {wl_mod.exception_summary(exc)}",
                            "make one training step run by hand first", line=line) from exc
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        raise WorkloadError(shown, f"the loss is a {type(loss).__name__}, not a scalar tensor",
                            "compute_loss(model, batch) must return a scalar tensor")


def _first_step(wl, device: str, shown: str, phase: Callable[[str], None]) -> None:
    """One step of the framework's own loop, as the user's settings run it: it must train."""
    phase("one step of the framework's own training loop")
    try:
        wl.loop.first_step(device)
    except WorkloadError:  # the adapter's own check of what the step showed
        raise
    except Exception as exc:
        line, _ = wl_mod.user_frame(exc, wl.path)
        raise WorkloadError(shown, f"one step of the framework's own training loop raised "
                                   f"{wl_mod.exception_summary(exc)}", "make one step of trainer.fit() run on its "
                            "own first (e.g. Trainer(max_steps=1))", line=line) from exc


def _optimizer(wl, model: torch.nn.Module, shown: str, phase: Callable[[str], None]) -> torch.optim.Optimizer:
    phase("building the optimizer")
    optimizer = build_optimizer(wl, model)  # a raise is a WorkloadError naming the user's line
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise WorkloadError(shown, f"build_optimizer() returned a {type(optimizer).__name__}, not a "
                                   "torch.optim.Optimizer", "return the optimizer built over the given params")
    return optimizer


def _safe_len(dataset) -> int | None:
    try:
        return len(dataset)
    except Exception:  # IterableDatasets often have no length
        return None
