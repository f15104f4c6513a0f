"""How the probe child names a failure: out of memory, no kernel for a knob's dtype or layout, torch.compile, or
the workload's own error, each with a one-line cause naming the user's frame. Runs only inside the child."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import torch

from .. import workload as wl_mod
from ..errors import WorkloadError
from .result import Status

# Every way an allocator says it is out of memory: the CPU allocator, CUDA's caching allocator and driver ("CUDA out
# of memory", "CUDA error: out of memory"), NCCL ("... out of memory"), cuBLAS and cuDNN failing to allocate their
# handles or workspaces, ROCm.
OOM_MARKERS = ("can't allocate memory", "out of memory", "DefaultCPUAllocator", "CUBLAS_STATUS_ALLOC_FAILED",
               "CUDNN_STATUS_ALLOC_FAILED", "CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation")
# cuBLAS and cuDNN answer NOT_SUPPORTED when no algorithm fits the workspace they could get: out of memory when
# the device is nearly full at the failure, a genuine lack of support otherwise.
WORKSPACE_MARKERS = ("CUDNN_STATUS_NOT_SUPPORTED", "CUBLAS_STATUS_NOT_SUPPORTED")
NEARLY_FULL = 0.9  # share of the device's memory in use

# An operator with no kernel for the dtype or memory layout a knob asked for, on this machine: oneDNN's primitive
# descriptors (e.g. no bf16 LSTM on CPUs without native bf16), ATen's dispatch ("not implemented for 'BFloat16'").
UNSUPPORTED_PATTERNS = (
    re.compile(r"could not create a primitive descriptor for (?:an? |the )?(?P<op>[\w ]+?)(?: forward| backward|"
               r" primitive|$)", re.I),
    re.compile(r"\"(?P<op>[\w:.]+)\" not implemented for '(?:BFloat16|Half|ComplexHalf)'"),
    re.compile(r"(?P<op>[\w:.]+) (?:is )?not (?:implemented|supported) for (?:BFloat16|Half|bf16|fp16|float16|"
               r"bfloat16|channels[_ ]last)", re.I),
)
# The knobs that change an operator's dtype or layout: only these can make a kernel go missing.
KERNEL_KNOBS = {"amp": "off", "channels_last": False, "matmul_precision": "highest", "compile": "off"}


def classify(exc: BaseException, path: Path, settings: dict[str, Any] | None = None,
             memory_used: Callable[[], float | None] | None = None) -> tuple[Status, str]:
    """Map an exception to a probe status and a one-line cause naming the user's frame when there is one.

    `memory_used` gives the share of the device's memory in use (default: the current CUDA device's, None
    without CUDA); it decides whether a cuBLAS/cuDNN NOT_SUPPORTED was a workspace that did not fit."""
    if isinstance(exc, WorkloadError):
        return Status.ERROR, str(exc)
    summary = wl_mod.exception_summary(exc)
    line, func = wl_mod.user_frame(exc, path)
    where = f" ({path.name}:{line} in {func})" if line else ""
    text = str(exc)
    oom_type = getattr(torch, "OutOfMemoryError", None)
    if isinstance(exc, MemoryError) or (oom_type and isinstance(exc, oom_type)) or any(
            m in text for m in OOM_MARKERS):
        return Status.OOM, summary.splitlines()[0][:400] + where
    if any(m in text for m in WORKSPACE_MARKERS):
        used = (memory_used or cuda_memory_used)()
        if used is not None and used >= NEARLY_FULL:
            return Status.OOM, (f"{summary.splitlines()[0][:300]} with {used:.0%} of the device's memory in use: "
                                f"no workspace fitted{where}")
    missing = unsupported(exc, settings or {})
    if missing:
        return Status.UNSUPPORTED, missing + where
    if "DataLoader worker" in text:
        where += " in a DataLoader worker"
    if type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
        return Status.ERROR, f"torch.compile failed: {summary.splitlines()[0][:500]}{where}"
    return Status.ERROR, summary[:600] + where


def unsupported(exc: BaseException, settings: dict[str, Any]) -> str | None:
    """Why the probe failed for want of a kernel here, naming the operator, the layer and the knob; None when
    the failure is not that (or no knob asked for another dtype or layout: then it is the workload's own)."""
    knobs_on = {k: settings[k] for k, off in KERNEL_KNOBS.items() if k in settings and settings[k] != off}
    if not knobs_on:
        return None
    text = str(exc)
    for pattern in UNSUPPORTED_PATTERNS:
        match = pattern.search(text)
        if match:
            layer = _failing_layer(exc)
            what = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in knobs_on.items())
            return (f"{match.group('op').strip()}{f' (in {layer})' if layer else ''} has no kernel here for {what}: "
                    f"{text.strip().splitlines()[0][:300]}")
    return None


def _failing_layer(exc: BaseException) -> str | None:
    """The innermost nn.Module whose forward was running when `exc` was raised, as "Name" or None."""
    layer, tb = None, exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module):
            layer = type(owner).__name__
        tb = tb.tb_next
    return layer


def cuda_memory_used() -> float | None:
    """Share of the current CUDA device's memory in use (this process's and others'), or None without CUDA."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / total if total else None
