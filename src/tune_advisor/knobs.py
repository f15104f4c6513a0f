"""The knob catalogue: names, valid values, when each applies, and how each is applied inside a probe.

This module needs no torch (validation and reports use it). How each knob is applied inside the probe child
lives in `probe/apply.py`.
"""

from __future__ import annotations

import difflib
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
            elif isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit()):
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
        Knob("amp", str, "off", "autocast mixed precision (CPU: bf16; CUDA: bf16 where supported, fp16 + GradScaler)",
             choices=("off", "bf16", "fp16"), candidates=("bf16", "fp16")),
        Knob("cudnn_benchmark", bool, False, "torch.backends.cudnn.benchmark autotuning (CUDA)", candidates=(True,)),
        Knob("channels_last", bool, False, "NHWC memory format for the model and 4-D/5-D inputs (conv models)",
             candidates=(True,)),
        Knob("checkpointing", bool, False, "gradient checkpointing of repeated blocks (trades compute for memory)",
             candidates=(True,)),
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


def describe(settings: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> str:
    """Short text of the settings (only those differing from `base` when given)."""
    items = [(k, v) for k, v in settings.items() if base is None or base.get(k) != v]
    return ", ".join(f"{k}={_text(v)}" for k, v in items) or "(baseline)"


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# --- applicability --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceFacts:
    type: str  # "cpu" or "cuda"
    name: str = ""
    bf16_supported: bool = True  # CUDA: torch.cuda.is_bf16_supported(); CPU: native bf16 (autocast works anyway)


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
    extra: dict = field(default_factory=dict)


def not_applicable(name: str, value: Any, workload: WorkloadFacts, device: DeviceFacts) -> str | None:
    """Why setting knob `name` to `value` cannot apply here, or None when it can."""
    if value == KNOBS[name].default:
        return None  # the default (off) always applies
    cuda = device.type == "cuda"
    if name in ("pin_memory", "cudnn_benchmark") and not cuda:
        return "not applicable: no CUDA device"
    if name == "amp":
        if value == "fp16" and not cuda:
            return "not applicable: fp16 autocast needs a CUDA device (on CPU, bf16 is the fast type)"
        if value == "bf16" and cuda and not device.bf16_supported:
            return f"not applicable: {device.name or 'this GPU'} has no bf16 support"
    if name == "channels_last" and workload.conv_layers == 0:
        return "not applicable: no convolution layers"
    if name == "checkpointing" and not (workload.hf_checkpointing or workload.repeated_blocks):
        return "not applicable: no repeated blocks to checkpoint"
    return None
