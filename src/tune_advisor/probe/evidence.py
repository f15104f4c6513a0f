"""What the probe child records besides running steps: each measured step's figures (results.json `raw`), proof
that each knob took effect, torch.compile's outcome, memory peaks, CPU time, debugging switches left on.

Runs only inside the child (torch is imported there anyway)."""

from __future__ import annotations

import math
import os
import random
import resource
import time
from typing import Any, Callable

import psutil
import torch

from ..analysis.stats import median
from . import apply

RAW_SERIES = ("step_s", "data_wait_s", "h2d_s", "items", "loss", "loss_step")  # results.json's `raw`, per step


def empty_raw() -> dict[str, list]:
    return {name: [] for name in RAW_SERIES}


class StepSeries:
    """The measured steps' figures, appended to `raw` (results.json's `raw`: one entry per measured step), the
    steps that began an epoch (rule TA103) and the per-sample input shapes seen (rules TA502, TA503)."""

    def __init__(self, raw: dict[str, list], count_items: Callable[[Any], float]):
        self.raw, self.count_items = raw, count_items
        self.epoch_starts: list[int] = []  # indices of measured steps whose batch began a new epoch
        self.sample_shapes: set = set()
        self.largest_input: int | None = None  # the most elements one sample of a batch held (padding included)

    def add(self, step: int, t0: float, t1: float, t2: float, t3: float, host_batch, loss: float,
            new_epoch: bool) -> None:
        """A measured step at global step `step` (warm-up counted): began at t0, had its batch at t1, on the device
        at t2, ended (synchronised) at t3."""
        raw = self.raw
        raw["step_s"].append(t3 - t0)
        raw["data_wait_s"].append(t1 - t0)
        raw["h2d_s"].append(t2 - t1)
        raw["items"].append(self.count_items(host_batch))  # the workload's code: a raise leaves the times kept
        raw["loss"].append(loss)
        # The global step (warm-up counted): probes warm up for different counts, and loss parity must compare
        # the losses of the same training step (analysis/parity.py).
        raw["loss_step"].append(step)
        if new_epoch:
            self.epoch_starts.append(len(raw["step_s"]) - 1)
        shape = sample_shape(host_batch)
        self.sample_shapes.add(shape)
        if shape is not None:
            self.largest_input = max(self.largest_input or 0, math.prod(shape))

    def non_finite_loss(self, step: int) -> None:
        """The loss of global step `step` was NaN or infinite (a warm-up step's too): kept as null, JSON has no NaN."""
        self.raw["loss"].append(None)
        self.raw["loss_step"].append(step)

    def shape_facts(self) -> dict[str, Any]:
        return {"epoch_start_steps": self.epoch_starts, "distinct_input_shapes": len(self.sample_shapes),
                "input_shapes_static": len(self.sample_shapes) <= 1}


def sample_shape(batch) -> tuple | None:
    """Shape of the batch's first tensor without the batch dimension (a short last batch is not a new shape)."""
    tensor = apply.first_tensor(batch)
    return tuple(tensor.shape[1:]) if tensor is not None else None


class KnobEvidence:
    """Records, during the first step, proof that each knob took effect inside this process."""

    def __init__(self, model, settings, hooks: bool = True):
        self.model, self.settings = model, settings
        self.dtypes: set[str] = set()
        self.block_calls = 0
        self.facts: dict[str, Any] = {}
        self.hooks = []
        self.observed = hooks
        if not hooks:
            return
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
                self.hooks.append(module.register_forward_hook(self._record_dtype))
        block = self._first_block()
        # A checkpointed block runs its layers twice per step: once more when backward recomputes them. The hook
        # sits on a layer inside the block, since Hugging Face checkpoints `forward` and skips the block's hooks.
        layer = next((m for m in block.modules() if not any(True for _ in m.children())
                      and any(True for _ in m.parameters(recurse=False))), None) if block is not None else None
        if layer is not None:
            self.hooks.append(layer.register_forward_pre_hook(self._count_block))

    def _first_block(self):
        found = apply.find_repeated_blocks(self.model)
        if found is None:
            return None
        _, container, indices = found
        return apply.block_at(container, indices[0])

    def _record_dtype(self, module, inputs, output):
        if hasattr(output, "dtype"):
            self.dtypes.add(str(output.dtype).replace("torch.", ""))

    def _count_block(self, module, inputs):
        self.block_calls += 1

    def after_first_step(self, host_batch, device_batch, loader, batches) -> None:
        for hook in self.hooks:
            hook.remove()
        convs = [m for m in self.model.modules() if isinstance(m, torch.nn.Conv2d)]
        host_tensor, device_tensor = apply.first_tensor(host_batch), apply.first_tensor(device_batch)
        self.facts = {
            "compute_dtypes": sorted(self.dtypes),
            "block_forwards_per_step": self.block_calls if self.block_calls else None,
            "conv_weights_channels_last": sum(
                m.weight.is_contiguous(memory_format=torch.channels_last) for m in convs) if convs else None,
            "conv_layers": len(convs),
            "input_channels_last": (device_tensor.is_contiguous(memory_format=torch.channels_last)
                                    if device_tensor is not None and device_tensor.dim() == 4 else None),
            "loader_workers": len(getattr(batches, "_workers", [])),
            "child_processes": len(psutil.Process().children()),
            "batch_pinned": bool(host_tensor.is_pinned()) if host_tensor is not None and loader.pin_memory else False,
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "hf_gradient_checkpointing": hf_checkpointing_state(self.model),
            "matmul_precision": torch.get_float32_matmul_precision(),
            "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
            "prefetch_factor": getattr(loader, "prefetch_factor", None),
        }
        if not self.observed:
            self.facts["compute_dtypes"] = None  # not observed: hooks stay out of a compiled model

    def report(self) -> dict[str, Any]:
        return self.facts


def hf_checkpointing_state(model) -> bool | None:
    """Whether a Hugging Face model reports checkpointing on (None for other models)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # newer name first
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return None


def optimizer_flags(optimizer) -> dict[str, Any]:
    """Evidence of optimizer_impl: the class and its foreach/fused flags as the optimizer holds them."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    return {"class": type(optimizer).__name__, "foreach": group.get("foreach"), "fused": group.get("fused")}


class CompileStats:
    """What torch.compile did, from dynamo's counters: graphs compiled at the first step, graphs compiled after it
    (recompiles: every step runs the same code, so a new graph means new input shapes or failed guards), graph
    breaks."""

    def __init__(self):
        # Only a compiled model needs dynamo; importing it costs seconds in a child not forked from the zygote.
        from torch._dynamo.utils import counters

        self.counters = counters
        self.marks = {"start": self._snapshot()}

    def _snapshot(self) -> dict[str, int]:
        return {"graphs": int(self.counters["stats"].get("unique_graphs", 0)),
                "graph_breaks": int(sum(self.counters["graph_break"].values()))}

    def graphs(self) -> int:
        return self._snapshot()["graphs"]

    def mark(self, name: str) -> None:
        self.marks[name] = self._snapshot()

    def summary(self, mode: str, warmup_step_s: list[float], step_s: list[float]) -> dict[str, Any]:
        end = self._snapshot()
        start = self.marks["start"]
        first, warm = self.marks.get("first_step", end), self.marks.get("warmup", end)
        steady = median(step_s) if step_s else 0.0
        return {
            "mode": mode,
            # Compilation (and autotuning) happens in the first steps: their time beyond the steady step.
            "compile_s": max(0.0, sum(warmup_step_s) - steady * len(warmup_step_s)),
            "first_step_s": warmup_step_s[0] if warmup_step_s else None,
            "graphs": end["graphs"] - start["graphs"],
            "graph_breaks": first["graph_breaks"] - start["graph_breaks"],  # per step: the first step's
            "recompiles_warmup": warm["graphs"] - first["graphs"],
            # Recompiles while measuring put compile time into timed steps.
            "recompiles_measured": end["graphs"] - warm["graphs"],
            # Why dynamo left code uncompiled (e.g. it does not trace LSTMs): the first line of each reason.
            "unsupported": sorted({str(k).strip().splitlines()[0][:200]
                                   for k in self.counters["unimplemented"]})[:5],
        }


LONGEST_SCAN_S = 1.0  # what scanning the dataset's item sizes may take of the inspection
FIXED_AFTER = 64  # items read at random that all have one size: the dataset's items are taken to be fixed in size


def item_size(item: Any) -> int | None:
    """How large one dataset item is, as `sample_shape` measures a collated batch's sample: its first tensor's
    element count, or the length of its first list of numbers (text tokenised, not yet collated); None where it
    holds neither."""
    if isinstance(item, torch.Tensor):
        return item.numel()
    if isinstance(item, (list, tuple)) and item and all(isinstance(x, (int, float)) for x in item):
        return len(item)
    values = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else ()
    for value in values:
        found = item_size(value)
        if found is not None:
            return found
    return None


def longest_item(dataset: Any, limit_s: float = LONGEST_SCAN_S,
                 clock: Callable[[], float] = time.monotonic) -> dict[str, Any] | None:
    """The dataset's longest item (`item_size`), read in a seeded random order for at most `limit_s` (a dataset
    read from storage does not scan in a second, so a partial scan covers its whole range, not only its start):
    {size, index, scanned, items, fixed}. `fixed`: the first FIXED_AFTER items read all had one size, and the scan
    stopped there. None without a length or indexing (an IterableDataset), or where an item has no size."""
    try:
        n = len(dataset)
    except Exception:  # an IterableDataset usually has none
        return None
    if n <= 0 or not hasattr(dataset, "__getitem__") or isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    rng, started = random.Random(0), clock()
    order = rng.sample(range(n), n) if n <= 100_000 else (rng.randrange(n) for _ in range(n))
    size, index, scanned, sizes = 0, None, 0, set()
    for i in order:
        try:
            found = item_size(dataset[i])
        except Exception:  # the dataset's own failure shows where the probes read it
            break
        if found is None:
            return None
        scanned += 1
        sizes.add(found)
        if found > size:
            size, index = found, i
        if (scanned == FIXED_AFTER and len(sizes) == 1) or clock() - started > limit_s:
            break
    if not scanned:
        return None
    return {"size": size, "index": index, "scanned": scanned, "items": n,
            "fixed": scanned < n and len(sizes) == 1 and scanned == FIXED_AFTER}


def memory_peaks(device: str) -> dict[str, Any]:
    """This process's peak RSS and, on CUDA, the caching allocator's peaks."""
    peaks = {"child_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if device.startswith("cuda"):
        peaks["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        peaks["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
    return peaks


def tree_cpu_seconds(proc) -> float:
    """CPU seconds of this process and its live children (loader workers)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # a worker may exit between listing and reading
            pass
    return total


def debug_switches() -> dict[str, Any]:
    """Debugging switches the workload may have left on, each slowing every step (rule TA202)."""
    profiler_enabled = getattr(torch._C._autograd, "_profiler_enabled", None)  # private; absent in some builds
    return {
        "anomaly_detection": torch.is_anomaly_enabled(),
        "autograd_profiler": bool(profiler_enabled()) if profiler_enabled else None,
        "cuda_launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0"),
    }
