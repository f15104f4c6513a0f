"""How each knob is applied inside the probe child (the catalogue and applicability live in `knobs.py`)."""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import Any, Mapping

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


def loader_kwargs(settings: Mapping[str, Any], device_type: str) -> dict[str, Any]:
    """DataLoader arguments for these settings (the worker-only ones only with workers: the DataLoader refuses
    them otherwise)."""
    kwargs = {
        "batch_size": settings["batch_size"],
        "num_workers": settings["num_workers"],
        "pin_memory": bool(settings["pin_memory"]) and device_type == "cuda",
    }
    if settings["num_workers"] > 0:
        kwargs.update(persistent_workers=bool(settings["persistent_workers"]),
                      prefetch_factor=settings["prefetch_factor"])
    return kwargs


def autocast(settings: Mapping[str, Any], device_type: str):
    """The autocast context of the `amp` knob (a null context when off)."""
    if settings["amp"] == "off":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if settings["amp"] == "bf16" else torch.float16
    return torch.autocast(device_type=device_type, dtype=dtype)


def grad_scaler(settings: Mapping[str, Any], device_type: str):
    """A GradScaler for fp16 on CUDA (fp16 gradients underflow without one); None otherwise."""
    if settings["amp"] == "fp16" and device_type == "cuda":
        return torch.amp.GradScaler("cuda")
    return None


def configure_backends(settings: Mapping[str, Any], device_type: str) -> None:
    if device_type == "cuda":
        torch.backends.cudnn.benchmark = bool(settings["cudnn_benchmark"])
    torch.set_float32_matmul_precision(settings["matmul_precision"])


def share_compile_headers() -> None:
    """Keep torch.compile's precompiled C++ headers where its cache is (TORCHINDUCTOR_CACHE_DIR), not in the probe's
    own temporary folder.

    Inductor puts them under `tempfile.gettempdir()` whatever the cache setting, and a probe child's TMPDIR is a
    scratch folder removed after it: every compiled probe then rebuilt them (about 150 MB, 4.4 s of g++ of an 8.6 s
    compile on 2 cores, hf_transformer) where a warm cache compiles in 4.2 s. A torch without them is left alone."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        from torch._inductor import codecache
    except ImportError:  # a torch built without inductor
        return
    if cache and hasattr(codecache, "_HEADER_DIR"):
        codecache._HEADER_DIR = os.path.join(cache, "precompiled_headers")
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")


def compile_model(model: nn.Module, settings: Mapping[str, Any]) -> nn.Module:
    """The model under torch.compile in the chosen mode (compilation itself happens at the first step)."""
    if settings["compile"] == "off":
        return model
    return torch.compile(model, mode=settings["compile"])


def optimizer_impl(optimizer: torch.optim.Optimizer, impl: str) -> torch.optim.Optimizer:
    """The same optimizer (class, parameter groups, hyper-parameters) rebuilt with the chosen implementation.

    Built before any step, so there is no state to carry over. `default` leaves the user's optimizer untouched:
    torch then picks foreach where it can (CUDA) and the per-parameter loop elsewhere.
    """
    if impl == "default":
        return optimizer
    flags = {"foreach": impl == "foreach", "fused": impl == "fused"}
    # A group's own keys override the constructor's defaults, so the flags go into every group.
    groups = [{**group, **flags} for group in optimizer.param_groups]
    # `defaults` may hold internal keys the constructor does not take (AdamW's decoupled_weight_decay).
    accepted = inspect.signature(type(optimizer).__init__).parameters
    kwargs = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return type(optimizer)(groups, **{**kwargs, **flags})


def supported_optimizer_impls(optimizer: torch.optim.Optimizer) -> list[str]:
    """Which of foreach/fused the optimizer's class accepts and can build with these parameters on this device."""
    accepted = inspect.signature(type(optimizer).__init__).parameters
    supported = []
    for impl in ("foreach", "fused"):
        if impl not in accepted:
            continue
        try:
            optimizer_impl(optimizer, impl)
        except (RuntimeError, ValueError, TypeError):  # e.g. fused on a device or dtype the kernels do not cover
            continue
        supported.append(impl)
    return supported


def prepare_model(model, settings: Mapping[str, Any], device) -> dict[str, Any]:
    """Move the model to `device` and apply channels_last and checkpointing. Returns what was done."""
    done: dict[str, Any] = {}
    model.to(device)
    if settings["channels_last"]:
        model.to(memory_format=torch.channels_last)
    if settings["checkpointing"]:
        done["checkpointing"] = enable_checkpointing(model)
    model.train()
    return done


def enable_checkpointing(model) -> dict[str, Any]:
    """Hugging Face models use their own switch; other models get their repeated blocks wrapped."""
    if getattr(model, "supports_gradient_checkpointing", False):
        # transformers 5 renamed the switch; 4.x has only the old name. Non-reentrant: the recommended variant.
        for switch, kwargs in (("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
                               ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs")):
            if hasattr(model, switch):
                getattr(model, switch)(**{kwargs: {"use_reentrant": False}})
                return {"method": f"hf {switch}()"}
    found = find_repeated_blocks(model)
    if found is None:
        raise RuntimeError("checkpointing: the model has no repeated blocks to checkpoint")
    path, container, indices = found
    for i in indices:
        if not isinstance(container[i], CheckpointedBlock):
            container[i] = CheckpointedBlock(container[i])
    return {"method": "torch.utils.checkpoint", "container": path, "blocks": len(indices)}


def find_repeated_blocks(model):
    """The ModuleList/Sequential holding the most parameters in >= 2 same-class composite children.

    Returns (qualified name, container, child indices) or None. Leaf layers (a lone Conv2d) are not blocks:
    checkpointing them saves nothing worth the recompute.
    """
    best, best_params = None, 0
    for path, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        groups: dict[type, list[int]] = {}
        for i, child in enumerate(module):
            inner = child.block if isinstance(child, CheckpointedBlock) else child
            if not any(True for _ in inner.children()):
                continue
            groups.setdefault(type(inner), []).append(i)
        for cls, indices in groups.items():
            if len(indices) < 2:
                continue
            params = sum(p.numel() for i in indices for p in module[i].parameters())
            if params > best_params:
                best, best_params = (path or "<model>", module, indices), params
    return best


def describe_repeated_blocks(model) -> str | None:
    found = find_repeated_blocks(model)
    if found is None:
        return None
    path, container, indices = found
    return f"{path}: {len(indices)} x {type(block_at(container, indices[0])).__name__}"


def block_at(container, index: int) -> nn.Module:
    """The user's block at `index`, unwrapped from a CheckpointedBlock."""
    child = container[index]
    return child.block if isinstance(child, CheckpointedBlock) else child


class CheckpointedBlock(nn.Module):
    """Runs the wrapped block under torch.utils.checkpoint: its activations are recomputed in backward."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def to_device(batch: Any, device: torch.device, non_blocking: bool, channels_last: bool) -> Any:
    """Move every tensor inside `batch` (tuples, lists, dicts, nested) to `device`.

    With channels_last, 4-D and 5-D floating inputs are converted too: a channels_last model fed NCHW inputs
    pays a layout conversion in its first convolution.
    """
    if isinstance(batch, torch.Tensor):
        moved = batch.to(device, non_blocking=non_blocking)
        if channels_last and moved.is_floating_point():
            if moved.dim() == 4:
                moved = moved.contiguous(memory_format=torch.channels_last)
            elif moved.dim() == 5:
                moved = moved.contiguous(memory_format=torch.channels_last_3d)
        return moved
    if isinstance(batch, dict):
        return type(batch)((k, to_device(v, device, non_blocking, channels_last)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device, non_blocking, channels_last) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking, channels_last) for v in batch)
    if hasattr(batch, "to") and hasattr(batch, "keys"):  # transformers BatchEncoding and the like
        return batch.to(device)
    return batch


def first_tensor(batch: Any) -> torch.Tensor | None:
    """The first tensor found in a (nested) batch, depth first."""
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        found = first_tensor(value)
        if found is not None:
            return found
    return None
