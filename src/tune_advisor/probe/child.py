"""Runs inside the probe child process: load the workload, apply the settings, train and time a few steps.

Invoked as `python -m tune_advisor.probe.child SPEC.json RESULT.json`. Always tries to leave RESULT.json behind
(written atomically); the parent classifies a missing one (signal, hard exit) itself. While it works, the child
writes what it is doing to RESULT.json.phase so that a probe killed at its time limit can say where it was stuck.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .. import workload as wl_mod
from ..errors import WorkloadError
from .spec import ProbeSpec
from .result import Status
from .window import MIN_WAVES_AT_CAP, EpochWindow

# Every way an allocator says it is out of memory: the CPU allocator, CUDA's caching allocator and driver ("CUDA out
# of memory", "CUDA error: out of memory"), NCCL ("... out of memory"), cuBLAS and cuDNN failing to allocate their
# handles or workspaces, ROCm.
OOM_MARKERS = ("can't allocate memory", "out of memory", "DefaultCPUAllocator", "CUBLAS_STATUS_ALLOC_FAILED",
               "CUDNN_STATUS_ALLOC_FAILED", "CUDA_ERROR_OUT_OF_MEMORY", "cudaErrorMemoryAllocation")
# cuBLAS and cuDNN answer NOT_SUPPORTED when no algorithm fits the workspace they could get: out of memory when
# the device is nearly full at the failure, a genuine lack of support otherwise.
WORKSPACE_MARKERS = ("CUDNN_STATUS_NOT_SUPPORTED", "CUBLAS_STATUS_NOT_SUPPORTED")
NEARLY_FULL = 0.9  # share of the device's memory in use


class Diverged(Exception):
    pass


class Phase:
    """Writes the current phase next to the result file (read by the parent on a timeout)."""

    def __init__(self, result_path: Path):
        self.path = result_path.with_name(result_path.name + ".phase")

    def __call__(self, text: str) -> None:
        try:
            self.path.write_text(text)
        except OSError:
            pass  # a phase note is a courtesy; it must never fail the probe


COMPILE_QUIET_STEPS = 3  # a compiled model is warm once this many steps in a row compiled nothing new
COMPILE_EXTRA_WARMUP = 30  # ... or after this many extra warm-up steps (shapes that never settle: see TA505)


def main(argv: list[str]) -> int:
    spec = ProbeSpec.from_json(Path(argv[0]).read_text())
    result_path = Path(argv[1])
    phase = Phase(result_path)
    if spec.mode == "inspect":
        result = inspect_workload(spec, phase)
    else:
        result = run_probe(spec, phase, workdir=result_path.parent)
    if spec.distributed and spec.mode == "probe":  # a torchrun rank: rank 0 writes the job's merged result
        from ..distributed import rank as ddp_rank

        return ddp_rank.finish(result, result_path, write_json_atomic)
    write_json_atomic(result_path, result)
    return 0


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(data), allow_nan=False, default=str))
    os.replace(tmp, path)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such figures (a noise that could not be computed) are written as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


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
    import torch

    layer, tb = None, exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module):
            layer = type(owner).__name__
        tb = tb.tb_next
    return layer


def classify(exc: BaseException, path: Path, settings: dict[str, Any] | None = None,
             memory_used: Callable[[], float | None] | None = None) -> tuple[Status, str]:
    """Map an exception to a probe status and a one-line cause naming the user's frame when there is one.

    `memory_used` gives the share of the device's memory in use (default: the current CUDA device's, None
    without CUDA); it decides whether a cuBLAS/cuDNN NOT_SUPPORTED was a workspace that did not fit."""
    import torch

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


def cuda_memory_used() -> float | None:
    """Share of the current CUDA device's memory in use (this process's and others'), or None without CUDA."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / total if total else None


# --- inspect ----------------------------------------------------------------------------------------------------


def inspect_workload(spec: ProbeSpec, phase: Phase) -> dict[str, Any]:
    """Load the workload and report its facts, or the load error (the parent turns it into exit code 2)."""
    try:
        return {"status": "ok", **_inspect(spec, phase)}
    except WorkloadError as exc:
        return {"status": "load_error", "error": {"cause": exc.cause, "fix": exc.fix, "line": exc.line}}


def _inspect(spec: ProbeSpec, phase: Phase) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    from . import apply

    phase("importing the workload file")
    wl = wl_mod.load(spec.workload)
    shown = spec.workload
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
    conv = sum(isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)) for m in model.modules())
    facts = {
        "model_class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "conv_layers": conv,
        "repeated_blocks": apply.describe_repeated_blocks(model),
        "hf_checkpointing": bool(getattr(model, "supports_gradient_checkpointing", False)),
        "iterable_dataset": isinstance(dataset, IterableDataset),
        "dataset_len": _safe_len(dataset),
    }

    phase("reading a first batch of 2 samples")
    try:
        batch = next(iter(DataLoader(dataset, batch_size=2, collate_fn=wl.collate_fn)))
    except StopIteration:
        raise WorkloadError(shown, "the dataset yields no batch", "build_dataset() must return a non-empty dataset")
    except Exception as exc:
        line, _ = wl_mod.user_frame(exc, wl.path)
        raise WorkloadError(shown, f"reading a first batch raised {wl_mod.exception_summary(exc)}",
                            "check the dataset's __getitem__/__iter__ and collate_fn", line=line) from exc
    facts["batch_kind"] = wl_mod.batch_kind(batch)
    if wl.compute_loss is None and facts["batch_kind"] not in ("dict", "pair"):
        raise WorkloadError(shown, f"the batch is a {facts['batch_kind']}, which the default loss cannot handle",
                            wl_mod.BATCH_FIX)

    phase("computing the loss on a first batch")
    device = torch.device(spec.device)
    model.to(device).train()
    loss_fn = wl.compute_loss or wl_mod.default_loss
    try:
        loss = loss_fn(model, apply.to_device(batch, device, False, False))
    except wl_mod.BatchError as exc:
        raise WorkloadError(shown, str(exc), wl_mod.BATCH_FIX) from None
    except Exception as exc:
        line, _ = wl_mod.user_frame(exc, wl.path)
        raise WorkloadError(shown, f"computing the loss on a first batch of 2 raised {wl_mod.exception_summary(exc)}",
                            "make one training step run by hand first", line=line) from exc
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        raise WorkloadError(shown, f"the loss is a {type(loss).__name__}, not a scalar tensor",
                            "compute_loss(model, batch) must return a scalar tensor")
    phase("building the optimizer")
    optimizer = _build_optimizer(wl, model)  # a raise is a WorkloadError naming the user's line
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise WorkloadError(shown, f"build_optimizer() returned a {type(optimizer).__name__}, not a "
                                   "torch.optim.Optimizer", "return the optimizer built over the given params")
    facts["optimizer_class"] = type(optimizer).__name__
    facts["optimizer_impls"] = apply.supported_optimizer_impls(optimizer)
    return {
        "facts": facts,
        "baseline": wl.baseline,
        "search": wl.search,
        "item_name": wl.item_name,
        "optional": [n for n in ("compute_loss", "build_optimizer", "collate_fn", "count_items")
                     if getattr(wl, n) is not None],
    }


def _safe_len(dataset) -> int | None:
    try:
        return len(dataset)
    except Exception:  # IterableDatasets often have no length
        return None


# --- probe ------------------------------------------------------------------------------------------------------


def run_probe(spec: ProbeSpec, phase: Phase, workdir: Path | None = None) -> dict[str, Any]:
    """Measure one configuration; never raises (a failure is a status). A profiler trace goes to `workdir`."""
    started = time.perf_counter()
    raw: dict[str, list] = {"step_s": [], "data_wait_s": [], "h2d_s": [], "items": [], "loss": [], "loss_step": []}
    out: dict[str, Any] = {"status": Status.OK.value, "error": None, "raw": raw, "applied": {}, "extra": {}}
    path = Path(spec.workload)
    try:
        _measure(spec, phase, out, workdir)
    except Diverged as exc:
        out["status"], out["error"] = Status.DIVERGED.value, str(exc)
    except SystemExit as exc:
        out["status"], out["error"] = Status.ERROR.value, f"the workload called sys.exit({exc.code})"
    except BaseException as exc:  # noqa: BLE001 — any failure of user code is a probe outcome
        status, message = classify(exc, path, spec.settings)
        out["status"], out["error"] = status.value, message
    out["extra"]["child_wall_s"] = time.perf_counter() - started
    if "memory" not in out:  # a probe that got through its measured steps took its peaks then
        out["memory"] = _memory_peaks(spec.device)
    return out


def _memory_peaks(device: str) -> dict[str, Any]:
    peaks = {"child_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if device.startswith("cuda"):
        import torch

        peaks["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        peaks["cuda_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
    return peaks


def _seed(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def _measure(spec: ProbeSpec, phase: Phase, out: dict[str, Any], workdir: Path | None = None) -> None:
    import psutil
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    from ..analysis.stats import wave_noise
    from ..collectors.nvml import NvmlSampler
    from ..distributed import rank as ddp_rank
    from . import apply, lockstep

    settings, proto, raw, applied = spec.settings, spec.protocol, out["raw"], out["applied"]
    baton = lockstep.baton(spec)  # lockstep pairs: the parent hands out the warm-up's turn and every measured step
    ddp = ddp_rank.setup(spec) if spec.distributed else None  # a torchrun rank joins its process group first
    device = ddp.device if ddp else torch.device(spec.device)
    phase("importing the workload file")
    wl = wl_mod.load(spec.workload)
    out["unit"] = f"{wl.item_name}/s"
    _seed(spec.seed)

    phase("building the model and dataset")
    model = wl.call("build_model")
    dataset = wl.call("build_dataset")
    apply.configure_backends(settings, device.type)
    applied.update(apply.prepare_model(model, settings, device))
    model = ddp.wrap(model) if ddp else model
    optimizer = apply.optimizer_impl(_build_optimizer(wl, model), settings["optimizer_impl"])
    applied["optimizer"] = _optimizer_flags(optimizer)
    compiled = settings["compile"] != "off"
    evidence = Evidence(model, settings, hooks=not compiled)  # hooks would be traced into the graph, then
    model = apply.compile_model(model, settings)  # removed: a recompile the probe would wrongly count
    compile_stats = CompileStats() if compiled else None
    scaler = apply.grad_scaler(settings, device.type)
    loss_fn = wl.compute_loss or wl_mod.default_loss
    iterable = isinstance(dataset, IterableDataset)
    shard = ddp.sampler(dataset, spec.seed) if ddp else None  # each rank reads its own part of the data
    loader = DataLoader(dataset, shuffle=not iterable and shard is None, sampler=shard, collate_fn=wl.collate_fn,
                        generator=None if iterable else torch.Generator().manual_seed(spec.seed),
                        **apply.loader_kwargs(settings, device.type))
    non_blocking = loader.pin_memory
    channels_last = bool(settings["channels_last"])
    cuda = device.type == "cuda"
    applied["grad_scaler"] = scaler is not None

    epoch_steps = _epoch_steps(loader) if settings["num_workers"] > 0 else None
    # Both sides of a lockstep pair import and build at once (mostly Python: hf_transformer's import takes 2 s);
    # the warm-ups, where torch's threads spin, take turns. Starting the loader's workers is part of the warm-up.
    baton.begin(epoch_steps)
    batches = iter(loader)
    epochs = 0
    epoch_starts: list[int] = []  # measured steps whose batch began a new epoch (rule TA103)
    sample_shapes: set = set()  # per-sample input shapes seen while measuring (rules TA502, TA503)

    def next_batch():
        nonlocal batches, epochs
        try:
            return next(batches)
        except StopIteration:  # epoch boundary: a new iterator (and new workers) as training would
            epochs += 1
            batches = iter(loader)
            return next(batches)

    def one_step(step: int, record: bool) -> float:
        t0 = time.perf_counter()
        epoch = epochs
        host_batch = next_batch()
        t1 = time.perf_counter()
        batch = apply.to_device(host_batch, device, non_blocking, channels_last)
        t2 = time.perf_counter()
        with apply.autocast(settings, device.type):
            loss = loss_fn(model, batch)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.detach().float().item()  # also synchronises the device
        if cuda:
            torch.cuda.synchronize()
        t3 = time.perf_counter()
        if step == 0:
            evidence.after_first_step(host_batch, batch, loader, batches)
        if not math.isfinite(value):
            raw["loss"].append(None)  # JSON has no NaN: a non-finite loss is recorded as null
            raw["loss_step"].append(step)
            kind = "warm-up " if not record else ""
            raise Diverged(f"loss became {value} at {kind}step {step + 1}")
        if record:
            raw["step_s"].append(t3 - t0)
            raw["data_wait_s"].append(t1 - t0)
            raw["h2d_s"].append(t2 - t1)
            raw["items"].append(_count_items(wl, host_batch))
            raw["loss"].append(value)
            # The global step (warm-up counted): probes warm up for different counts, and loss parity must compare
            # the losses of the same training step (analysis/parity.py).
            raw["loss_step"].append(step)
            if epochs != epoch:
                epoch_starts.append(len(raw["step_s"]) - 1)
            sample_shapes.add(_sample_shape(host_batch))
        return t3 - t0

    def forward_backward() -> float:
        """One step's forward and backward without the optimizer (for the FLOP counter); returns its items."""
        host_batch = next_batch()
        batch = apply.to_device(host_batch, device, non_blocking, channels_last)
        with apply.autocast(settings, device.type):
            loss = loss_fn(model, batch)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        optimizer.zero_grad(set_to_none=True)
        return _count_items(wl, host_batch)

    phase(f"warm-up: waiting for the first batch ({settings['num_workers']} loader workers)")
    warmup_start = time.perf_counter()
    # Loader workers fill a queue of prefetch_factor batches each before training starts; timing that backlog
    # would credit many workers with a burst no long run sees. Warm-up drains it first.
    warmup_steps = max(proto.warmup_steps, settings["num_workers"] * settings["prefetch_factor"])
    warmup_step_s = []
    for step in range(warmup_steps):
        if compiled and step == 0:
            phase("warm-up step 1: torch.compile compiling the model")
        warmup_step_s.append(one_step(step, record=False))
        if compile_stats and step == 0:
            compile_stats.mark("first_step")
        phase(f"warm-up step {step + 1} of {warmup_steps} done")
    if compile_stats:
        # Dynamo recompiles when input shapes change (then compiles a dynamic-shape graph): warm-up goes on until
        # COMPILE_QUIET_STEPS steps in a row compile nothing, so the timed steps see the settled graph.
        quiet = 0
        while quiet < COMPILE_QUIET_STEPS and len(warmup_step_s) < warmup_steps + COMPILE_EXTRA_WARMUP:
            graphs = compile_stats.graphs()
            phase(f"warm-up step {len(warmup_step_s) + 1}: torch.compile may still be compiling")
            warmup_step_s.append(one_step(len(warmup_step_s), record=False))
            quiet = quiet + 1 if compile_stats.graphs() == graphs else 0
        warmup_steps = len(warmup_step_s)
    out["extra"]["warmup_s"] = time.perf_counter() - warmup_start
    out["extra"]["warmup_steps"] = warmup_steps
    out["extra"]["warmup_step_s"] = warmup_step_s
    if compile_stats:
        compile_stats.mark("warmup")
    # The noise of a loader-fed step is judged over waves of num_workers steps (analysis.stats.wave_noise), so the
    # step cap is counted in waves too: a busy loader gets as many waves to settle as a single process gets steps.
    max_steps = max(proto.max_steps, MIN_WAVES_AT_CAP * settings["num_workers"])
    window = EpochWindow(epoch_steps, max_steps, proto.max_time_s, wave=settings["num_workers"])

    phase("measuring")
    me = psutil.Process()
    gpu_sampler = NvmlSampler(spec.device)  # a sleeping thread; on the CPU or without NVML it only notes why
    gpu_sampler.start()
    cpu_before = _tree_cpu_seconds(me)
    measure_start = time.perf_counter()
    step = warmup_steps
    try:
        while baton.wait():  # always true unless in lockstep, where the parent decides when both sides stop
            one_step(step, record=True)
            baton.done(raw["step_s"][-1], raw["items"][-1])
            step += 1
            if baton.active:
                continue
            n, elapsed = len(raw["step_s"]), time.perf_counter() - measure_start
            done = n >= max_steps or elapsed >= proto.max_time_s or (
                n >= proto.min_steps and elapsed >= proto.min_time_s
                and wave_noise(raw["step_s"], settings["num_workers"]) <= proto.noise_bar)
            done = window.done(done, n, elapsed)
            if ddp.agree(done) if ddp else done:  # DDP ranks must run the same steps: rank 0 decides for all
                break
        measured_wall = time.perf_counter() - measure_start - baton.idle_s  # lockstep: minus the partner's turns
        cpu_used = _tree_cpu_seconds(me) - cpu_before
    finally:
        gpu_sampler.stop()
    if compile_stats:
        out["extra"]["compile"] = compile_stats.summary(settings["compile"], warmup_step_s, raw["step_s"])
    out["extra"].update({
        "measured_wall_s": measured_wall,
        "cpu_util": cpu_used / measured_wall / (psutil.cpu_count() or 1) if measured_wall > 0 else None,
        "epochs_started": epochs,
        "torch_threads": torch.get_num_threads(),
        "noise": wave_noise(raw["step_s"], settings["num_workers"]),
        "epoch_start_steps": epoch_starts,
        "epoch_steps": epoch_steps,
        "distinct_input_shapes": len(sample_shapes),
        "input_shapes_static": len(sample_shapes) <= 1,
        **_debug_switches(),
    })
    if baton.active:
        out["extra"]["lockstep"] = baton.report()
    applied.update(evidence.report())

    # Collectors that need steps of their own run now, after the timing, and never fail the probe.
    out["memory"] = _memory_peaks(spec.device)  # the measured steps' peaks, before any extra step
    out["gpu"] = gpu_sampler.result()
    collectors = out["extra"]["collectors"] = {"nvml": gpu_sampler.status}
    if ddp:  # extra steps for FLOPs or the profiler would need every rank to join their all-reduces alike
        out["extra"]["local_step_s"] = ddp.local_steps(model, lambda i: one_step(step + i, record=False))
        collectors["flops"] = collectors["profiler"] = "skipped: distributed probe"
        phase("done")
        return
    if spec.count_flops:
        phase("counting FLOPs of one step")
        collectors["flops"] = _collect_flops(spec, out, forward_backward)
    else:
        collectors["flops"] = "skipped: a re-measurement (the first probe of these settings counted them)"
    if spec.profile:
        phase("profiling extra steps")
        profile_start = time.perf_counter()
        collectors["profiler"] = _collect_profile(spec, out, workdir, lambda i: one_step(step + i, record=False))
        out["extra"]["profile_wall_s"] = time.perf_counter() - profile_start  # not part of an unprofiled probe
    else:
        collectors["profiler"] = "skipped: not a designated probe"
    phase("done")


def _collect_flops(spec: ProbeSpec, out: dict[str, Any], forward_backward) -> str:
    """`extra.flops`: FLOPs of one step scaled to the typical measured batch, and MFU against the cached peak."""
    from ..analysis.stats import median
    from ..collectors import flops

    try:
        raw = out["raw"]
        items: list[float] = []
        by_op = flops.count_flops_by_op(lambda: items.append(forward_backward()))
        counted = sum(by_op.values())
        per_step = counted * median(raw["items"]) / items[0] if items and items[0] else counted
        key = flops.peak_key(spec.device)
        peaks = flops.cached_peaks(spec.device, key)
        dtype = flops.compute_dtype(spec.settings["amp"], spec.device, flops.conv_share(by_op))
        summary = flops.summarise(per_step, median(raw["step_s"]), peaks, dtype, flops.peak_gaps(spec.device, key))
        out["extra"]["flops"] = summary
    except Exception as exc:  # noqa: BLE001 — a collector's failure is a note, not a probe failure
        return f"error: {type(exc).__name__}: {exc}"
    if summary["mfu"] is None:
        return f"partial: {summary['mfu_unavailable']} (cache: {flops.cache_path()})"
    return "ok"


def _collect_profile(spec: ProbeSpec, out: dict[str, Any], workdir: Path | None, run_step) -> str:
    """`extra.profile`: torch.profiler over a few extra steps; the gzipped trace goes next to the result."""
    from ..collectors import profiler

    losses, loss_steps = out["raw"]["loss"], out["raw"]["loss_step"]
    kept = len(losses)
    try:
        trace_path = workdir / f"{spec.id}.trace.json.gz" if workdir is not None else None
        summary = profiler.profile_steps(run_step, spec.device.split(":")[0], trace_path)
    except Exception as exc:  # noqa: BLE001 — including a loss turning non-finite in a profiled step
        del losses[kept:], loss_steps[kept:]  # the profiled steps are not measured steps
        return f"error: {type(exc).__name__}: {exc}"
    out["extra"]["profile"] = summary
    note = summary["trace"].get("note")
    return f"ok ({note})" if note else "ok"


def _build_optimizer(wl, model):
    import torch

    if wl.build_optimizer:
        return wl.call("build_optimizer", model.parameters())
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def _optimizer_flags(optimizer) -> dict[str, Any]:
    """Evidence of optimizer_impl: the class and its foreach/fused flags as the optimizer holds them."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    return {"class": type(optimizer).__name__, "foreach": group.get("foreach"), "fused": group.get("fused")}


class CompileStats:
    """What torch.compile did, from dynamo's counters: graphs compiled at the first step, graphs compiled after it
    (recompiles: every step runs the same code, so a new graph means new input shapes or failed guards), graph
    breaks."""

    def __init__(self):
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
        from ..analysis.stats import median

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


def _epoch_steps(loader) -> int | None:
    """Batches per epoch, or None when the dataset has no length (an IterableDataset without __len__)."""
    try:
        return len(loader) or None
    except TypeError:
        return None


def _count_items(wl, host_batch) -> float:
    from .apply import first_tensor

    if wl.count_items is not None:
        return float(wl.count_items(host_batch))
    tensor = first_tensor(host_batch)
    return float(tensor.shape[0]) if tensor is not None and tensor.dim() > 0 else 1.0


def _sample_shape(batch) -> tuple | None:
    """Shape of the batch's first tensor without the batch dimension (a short last batch is not a new shape)."""
    from .apply import first_tensor

    tensor = first_tensor(batch)
    return tuple(tensor.shape[1:]) if tensor is not None else None


def _debug_switches() -> dict[str, Any]:
    """Debugging switches the workload may have left on, each slowing every step (rule TA202)."""
    import torch

    profiler_enabled = getattr(torch._C._autograd, "_profiler_enabled", None)  # private; absent in some builds
    return {
        "anomaly_detection": torch.is_anomaly_enabled(),
        "autograd_profiler": bool(profiler_enabled()) if profiler_enabled else None,
        "cuda_launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0"),
    }


def _tree_cpu_seconds(proc) -> float:
    """CPU seconds of this process and its live children (loader workers)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except Exception:  # a worker may exit between listing and reading
            pass
    return total


class Evidence:
    """Records, during the first step, proof that each knob took effect inside this process."""

    def __init__(self, model, settings, hooks: bool = True):
        import torch

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
        from . import apply

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
        import psutil
        import torch

        from .apply import first_tensor

        for hook in self.hooks:
            hook.remove()
        convs = [m for m in self.model.modules() if isinstance(m, torch.nn.Conv2d)]
        host_tensor, device_tensor = first_tensor(host_batch), first_tensor(device_batch)
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
            "hf_gradient_checkpointing": _hf_checkpointing_state(self.model),
            "matmul_precision": torch.get_float32_matmul_precision(),
            "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
            "prefetch_factor": getattr(loader, "prefetch_factor", None),
        }
        if not self.observed:
            self.facts["compute_dtypes"] = None  # not observed: hooks stay out of a compiled model

    def report(self) -> dict[str, Any]:
        return self.facts


def _hf_checkpointing_state(model) -> bool | None:
    """Whether a Hugging Face model reports checkpointing on (None for other models)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # newer name first
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
