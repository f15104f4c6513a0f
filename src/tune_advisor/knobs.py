"""The knob catalogue: names, valid values, when each applies, and how each is applied inside a probe.

This module needs no torch (validation and reports use it). How each knob is applied inside the probe child
lives in `probe/apply.py`.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping


@dataclass(frozen=True)
class Knob:
    name: str
    type: type  # int, bool or str
    default: Any
    help: str
    choices: tuple = ()  # valid values of a str knob
    minimum: int | None = None  # smallest valid value of an int knob
    candidates: tuple = ()  # values the planner tries when SEARCH does not name the knob

    def parse(self, value: Any) -> Any:
        """Return `value` as this knob's type, accepting CLI strings ("true", "64"). Raises ValueError."""
        if self.type is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
        elif self.type is int:
            if isinstance(value, bool):
                pass  # True is an int to Python, never a batch size to us
            # isdecimal, not isdigit: int() refuses digits like "²" (found by the property tests)
            elif isinstance(value, int) or (isinstance(value, str) and value.strip().removeprefix("-").isdecimal()):
                number = int(value)
                if self.minimum is None or number >= self.minimum:
                    return number
        elif self.type is str:
            if isinstance(value, str) and value in self.choices:
                return value
        raise ValueError(f"{value!r} is not a valid value for {self.name}; valid: {self.valid_values()}")

    def valid_values(self) -> str:
        if self.type is bool:
            return "true, false"
        if self.type is int:
            return f"an integer >= {self.minimum}"
        return ", ".join(self.choices)


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in [
        Knob("batch_size", int, 32, "samples per step (changes optimisation: scale the LR or accumulate)",
             minimum=1),
        Knob("num_workers", int, 0, "DataLoader worker processes", minimum=0, candidates=(1, 2, 4, 8, 16)),
        Knob("pin_memory", bool, False, "page-locked host batches + non_blocking copies (CUDA)",
             candidates=(True,)),
        Knob("amp", str, "off", "autocast mixed precision (bf16 where the device computes it natively; CUDA: "
                                "also fp16 + GradScaler)",
             choices=("off", "bf16", "fp16"), candidates=("bf16", "fp16")),
        Knob("cudnn_benchmark", bool, False, "torch.backends.cudnn.benchmark autotuning (CUDA)", candidates=(True,)),
        Knob("channels_last", bool, False, "NHWC memory format for the model and 4-D/5-D inputs (conv models)",
             candidates=(True,)),
        Knob("checkpointing", bool, False, "gradient checkpointing of repeated blocks (trades compute for memory)",
             candidates=(True,)),
        # max-autotune compiles for minutes and reduce-overhead adds CUDA graphs: SEARCH can name them.
        Knob("compile", str, "off", "torch.compile of the model (compile time is measured apart and amortised)",
             choices=("off", "default", "reduce-overhead", "max-autotune"), candidates=("default",)),
        Knob("matmul_precision", str, "highest", "torch.set_float32_matmul_precision for float32 matmuls (high: "
                                                 "TF32 on Ampere+ GPUs; medium: bf16 inside, also on bf16 CPUs)",
             choices=("highest", "high", "medium"), candidates=("high", "medium")),
        Knob("persistent_workers", bool, False, "keep DataLoader workers alive across epochs (num_workers > 0)",
             candidates=(True,)),
        Knob("prefetch_factor", int, 2, "batches each DataLoader worker loads ahead (num_workers > 0)", minimum=1,
             candidates=(4,)),
        Knob("optimizer_impl", str, "default", "the optimizer's implementation: per-parameter loop, foreach "
                                               "(batched), or fused kernels", choices=("default", "foreach", "fused"),
             candidates=("foreach", "fused")),
        # distributed (DDP; apply only under --nproc-per-node > 1)
        Knob("ddp_bucket_cap_mb", int, 25, "DDP gradient bucket size in MiB (all-reduce granularity)", minimum=1,
             candidates=(5, 100)),
        Knob("gradient_as_bucket_view", bool, False, "DDP gradients as views into the all-reduce buckets (saves a "
                                                     "copy and memory)", candidates=(True,)),
        Knob("static_graph", bool, False, "DDP static_graph: the same parameters are used every step",
             candidates=(True,)),
        Knob("ddp_backend", str, "auto", "torch.distributed backend (auto: NCCL on CUDA, gloo on the CPU)",
             choices=("auto", "nccl", "gloo")),
    ]
}


def unknown_knob_message(name: str) -> str:
    close = difflib.get_close_matches(name, KNOBS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown knob '{name}'{hint}; valid knobs: {', '.join(KNOBS)}"


def defaults() -> dict[str, Any]:
    return {name: knob.default for name, knob in KNOBS.items()}


def validate_settings(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Check a partial settings mapping (BASELINE, --set); return it parsed. Raises ValueError naming the problem."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"must be a dict of knob -> value, not {type(raw).__name__}")
    parsed = {}
    for name, value in raw.items():
        if name not in KNOBS:
            raise ValueError(unknown_knob_message(str(name)))
        parsed[name] = KNOBS[name].parse(value)
    return parsed


def validate_search(raw: Mapping[str, Any]) -> dict[str, list]:
    """Check a SEARCH mapping of knob -> candidate values; return it parsed."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"must be a dict of knob -> list of values, not {type(raw).__name__}")
    parsed = {}
    for name, values in raw.items():
        if name not in KNOBS:
            raise ValueError(unknown_knob_message(str(name)))
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise ValueError(f"['{name}'] must be a list of values, not {values!r}")
        values = list(values)
        if not values:
            raise ValueError(f"['{name}'] is empty; give at least one value")
        try:
            parsed[name] = [KNOBS[name].parse(v) for v in values]
        except ValueError as exc:
            raise ValueError(f"['{name}']: {exc}") from None
    return parsed


def full_settings(partial: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every knob with a value: the defaults overlaid with `partial`."""
    settings = defaults()
    settings.update(partial or {})
    return settings


def batch_change_note(old: int, new: int, dataset_len: int | None = None) -> str:
    """What changing batch_size from `old` to `new` does to the optimisation, and how to keep or adapt to it.

    Throughput is compared per sample, but an optimiser step then averages over a different number of samples.
    """
    k = new / old
    per_epoch = (-(-dataset_len // old), -(-dataset_len // new)) if dataset_len else None
    steps = f"; {per_epoch[0]:,} → {per_epoch[1]:,} optimizer steps per epoch" if per_epoch else ""
    text = f"batch_size {old} → {new}: each optimizer step averages {k:g}x the samples{steps}. "
    if new > old:
        text += (f"Scale the learning rate about {k:g}x (linear rule, SGD) or {k ** 0.5:.3g}x (square root, "
                 f"Adam-style) with a warm-up, and re-check convergence")
        if new % old == 0:
            text += (f"; if you already accumulate gradients over n micro-batches of {old}, accumulate n/{new // old} "
                     f"of {new} to keep your effective batch of {old}·n")
        return text + "."
    if old % new == 0:
        return text + (f"To keep your effective batch of {old}, accumulate gradients over {old // new} "
                       f"micro-batches of {new} (loss / {old // new}, one optimizer step per {old // new}).")
    return text + f"Scale the learning rate about {k:.3g}x, or accumulate gradients to an effective batch near {old}."


def changes(settings: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that differ from `base`'s, with their values in `settings`."""
    return {k: v for k, v in settings.items() if base.get(k) != v}


def describe(settings: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> str:
    """Short text of the settings (only those differing from `base` when given)."""
    items = (settings if base is None else changes(settings, base)).items()
    return ", ".join(f"{k}={_text(v)}" for k, v in items) or "(baseline)"


def brief(settings: Mapping[str, Any]) -> str:
    """Settings as people state them: batch size and loader workers, then only the knobs away from their default."""
    always = ("batch_size", "num_workers")
    shown = {k: v for k, v in settings.items() if k in always or (k in KNOBS and v != KNOBS[k].default)}
    return describe(shown)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# --- applicability --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceFacts:
    type: str  # "cpu" or "cuda"
    name: str = ""
    # bf16 computed natively (hardware.native_types): CUDA compute capability >= 8.0; CPU avx512_bf16/amx_bf16 or
    # Arm's bf16. Elsewhere torch emulates it, many times slower than float32, so bf16 knobs do not apply.
    bf16_supported: bool = True
    bf16_reason: str = ""  # why bf16 is or is not native, as hardware.native_types says
    tf32: bool = False  # CUDA compute capability >= 8.0 (Ampere+), where matmul_precision=high means TF32
    compile_unavailable: str | None = None  # why torch.compile cannot run here (no C++ compiler, no triton)
    world_size: int = 1  # processes of a DDP probe (--nproc-per-node x --nnodes)
    cpu_cores: int | None = None  # cores the run may use (environment.usable_cores): what a CPU-bound loader can use
    # the device's measured matmul roof per dtype ("fp32", "bf16", ...; FLOP/s: collectors.flops), None unmeasured
    matmul_peaks: Mapping[str, float] | None = None


@dataclass(frozen=True)
class WorkloadFacts:
    """What inspecting the workload (in a child process) found; decides which knobs apply."""

    model_class: str = ""
    parameters: int = 0
    conv_layers: int = 0
    repeated_blocks: str | None = None  # e.g. "layers: 4 x Block"
    hf_checkpointing: bool = False
    iterable_dataset: bool = False
    dataset_len: int | None = None
    batch_kind: str = ""
    optimizer_class: str = ""
    optimizer_impls: tuple = ()  # "foreach"/"fused" when the workload's optimizer was built with them here
    extra: dict = field(default_factory=dict)


LOADER_KNOBS = ("persistent_workers", "prefetch_factor")  # DataLoader arguments that exist only with workers
DDP_KNOBS = ("ddp_bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "ddp_backend")


def workers_the_cores_feed(fetch_cpu_frac: float, cores: int) -> int:
    """Loader workers that `cores` keep busy when loading keeps a thread on a CPU `fetch_cpu_frac` of the time
    (results.json `extra.fetch_cpu_frac`): each worker needs that share of a core, so past cores / share more
    workers only queue for the CPU and take it from the training threads."""
    return max(1, int(cores / max(fetch_cpu_frac, 0.01)))


LOADING_MARGIN = 1.1  # workers enough to load a batch in 1/1.1 of its compute: the loading time jitters


def workers_the_loading_needs(batch_size: int, load_s_per_sample: float, compute_s: float) -> int:
    """Loader workers that keep a step of `compute_s` seconds fed when one sample takes `load_s_per_sample` to load
    (read, decode, collate): W workers load a batch in batch_size x load / W, which must not exceed the compute it
    overlaps (with LOADING_MARGIN to spare)."""
    return max(1, math.ceil(LOADING_MARGIN * batch_size * load_s_per_sample / max(compute_s, 1e-9)))


def not_applicable(name: str, value: Any, workload: WorkloadFacts, device: DeviceFacts,
                   settings: Mapping[str, Any] | None = None) -> str | None:
    """Why setting knob `name` to `value` cannot apply here (alongside `settings`, when given), or None."""
    if value == KNOBS[name].default:
        return None  # the default (off) always applies
    script = (workload.extra or {}).get("script")
    if script is not None:
        reason = _script_not_applicable(name, value, script)
        if reason:
            return reason
    if name in LOADER_KNOBS and settings is not None and not settings.get("num_workers"):
        return "not applicable: num_workers=0 (no loader workers)"
    cuda = device.type == "cuda"
    if name in ("pin_memory", "cudnn_benchmark") and not cuda:
        return "not applicable: no CUDA device"
    if name == "amp":
        if value == "fp16" and not cuda:
            return "not applicable: fp16 autocast needs a CUDA device (on CPU, bf16 is the fast type)"
        if value == "bf16" and not device.bf16_supported:
            return f"not applicable: {_no_native_bf16(device)}"
    if name == "channels_last" and workload.conv_layers == 0:
        return "not applicable: no convolution layers"
    if name == "checkpointing" and not (workload.hf_checkpointing or workload.repeated_blocks):
        return "not applicable: no repeated blocks to checkpoint"
    if name == "compile":
        if device.compile_unavailable:
            return f"not applicable: {device.compile_unavailable}"
        if value == "reduce-overhead" and not cuda:
            return "not applicable: reduce-overhead adds CUDA graphs, which need a CUDA device"
    if name == "matmul_precision":
        if cuda and not device.tf32:
            return "not applicable: reduced-precision float32 matmuls need compute capability 8.0 or newer (Ampere+)"
        if not cuda and value == "high":
            return "not applicable: TF32 is a CUDA feature; on the CPU `high` computes as `highest`"
        if not cuda and not device.bf16_supported:
            return f"not applicable: medium computes float32 matmuls in bf16, and {_no_native_bf16(device)}"
    if name in DDP_KNOBS and device.world_size <= 1:
        return "not applicable: a single process (DDP knobs need --nproc-per-node 2 or more)"
    if name == "ddp_backend" and value == "nccl" and not cuda:
        return "not applicable: NCCL needs CUDA devices (gloo runs on the CPU)"
    if name == "optimizer_impl" and value not in workload.optimizer_impls:
        return (f"not applicable: {workload.optimizer_class or 'the optimizer'} cannot be built with "
                f"{value}=True here")
    return None


SCRIPT_MODEL_KNOBS = ("amp", "channels_last", "compile", "checkpointing")
SCRIPT_LOADER_KNOBS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


def _script_not_applicable(name: str, value: Any, script: Mapping[str, Any]) -> str | None:
    """Why script mode cannot set knob `name` from outside the script (script/hooks.py), as its inspection saw the
    script (WorkloadFacts.extra["script"]); None for a knob the script's own flag sets (--map)."""
    if name in script.get("mapped", ()):
        return None
    hint = f"; to set it through the script's own flag: --map {name}=--FLAG"
    if name in SCRIPT_LOADER_KNOBS:
        loader = script.get("loader")
        if not loader:
            return "not applicable: the script builds no torch DataLoader before its optimizer steps" + hint
        if name == "batch_size" and loader.get("batch_sampler"):
            return "not applicable: the script's DataLoader takes a batch_sampler, which decides the batch" + hint
    if name == "optimizer_impl":
        return ("not applicable in script mode: the script builds its own optimizer (foreach=True or fused=True "
                "go into its constructor)")
    if name in SCRIPT_MODEL_KNOBS:
        if not script.get("model_found"):
            return "not applicable: no nn.Module holds the parameters of the script's optimizer" + hint
        if script.get("optimizers", 1) > 1:
            return (f"not applicable: the script steps {script['optimizers']} optimizers, so no one model can be "
                    "changed safely from outside" + hint)
        if name == "amp" and script.get("own_autocast"):
            return "not applicable: the script enters torch.autocast itself" + hint
        if name == "amp" and value == "fp16":
            return "not applicable in script mode: fp16 needs a GradScaler in the script's own loop" + hint
        if name in ("compile", "checkpointing") and script.get("own_compile"):
            return "not applicable: the script compiles its model itself" + hint
    return None


def _no_native_bf16(device: DeviceFacts) -> str:
    if device.bf16_reason:
        return device.bf16_reason
    if device.type == "cuda":
        return f"{device.name or 'this GPU'} has no bf16 support (compute capability 8.0 or newer needed)"
    return "this CPU has no native bf16 (avx512_bf16/amx_bf16, or bf16 on Arm)"
