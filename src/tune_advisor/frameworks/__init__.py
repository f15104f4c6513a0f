"""Framework adapters: a Hugging Face `Trainer` or a Lightning module handed over as the workload (docs/frameworks.md).

`kind_of` says which contract a workload file follows, from the functions it defines; `adapt` turns the user's
framework object into the plain workload's parts (model, dataset, loss, optimizer, baseline). The adapters import
their framework only when a file of that kind is loaded, so the core never imports transformers or lightning.
"""

from __future__ import annotations

import difflib
from types import ModuleType
from typing import Any, Callable

from .common import Adapted, Loop, LoopProbe, OptimizerStep

__all__ = ["Adapted", "Loop", "LoopProbe", "OptimizerStep", "ENTRY", "adapt", "batch_note", "install_hint", "kind_of",
           "misspelled_entry", "recommendation"]

# The entry function that marks each kind, in the order they are checked after the plain contract
# (build_model/build_dataset), which always wins.
ENTRY = {"lightning": "build_module", "hf": "build_trainer"}
PLAIN = ("build_model", "build_dataset")
# The frameworks' packages, and the tune-advisor extra that installs each.
EXTRAS = {"transformers": "hf", "accelerate": "hf", "lightning": "lightning", "pytorch_lightning": "lightning"}


def kind_of(module: ModuleType) -> str | None:
    """"hf" or "lightning" when the file hands over a framework object, None for the plain contract (or none)."""
    if any(hasattr(module, name) for name in PLAIN):
        return None
    for kind, entry in ENTRY.items():
        if hasattr(module, entry):
            return kind
    return None


def misspelled_entry(module: ModuleType) -> tuple[str, str] | None:
    """(entry meant, name found) when a file defines no contract's function but one close to a framework entry
    (`build_trainr`), so the error can name the typo instead of the plain contract."""
    if any(hasattr(module, name) for name in PLAIN):
        return None
    defined = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
    for entry in ENTRY.values():
        close = difflib.get_close_matches(entry, defined, n=1, cutoff=0.8)
        if close:
            return entry, close[0]
    return None


def install_hint(missing: str | None) -> str | None:
    """The fix for a workload file whose import of a framework package failed (None: not a framework's)."""
    top = (missing or "").split(".")[0]
    if top not in EXTRAS:
        return None
    return f"pip install 'tune-advisor[{EXTRAS[top]}]' (the {top} package is an optional extra)"


def adapt(kind: str, module: ModuleType, shown: str, call: Callable) -> Adapted:
    """The workload parts of the framework object the file builds. `call(name, fn, *args)` runs a user function,
    turning a raise into a WorkloadError at the user's line. Raises WorkloadError for every unusable object."""
    if kind == "hf":
        from . import hf

        return hf.adapt(module, shown, call)
    from . import lightning

    return lightning.adapt(module, shown, call)


def recommendation(framework: dict[str, Any], base: dict[str, Any], recommended: dict[str, Any]) -> str | None:
    """The recommended settings in the framework's own terms (None for a plain workload)."""
    name, config = _parts(framework)
    if name == "hf":
        from . import hf

        return hf.recommendation(base, recommended, config)
    if name == "lightning":
        from . import lightning

        return lightning.recommendation(base, recommended, config)
    return None


def batch_note(framework: dict[str, Any], base: dict[str, Any], recommended: dict[str, Any]) -> str | None:
    """What a batch-size change means in the framework's terms (None: the plain note applies)."""
    name, config = _parts(framework)
    if name == "hf" and base.get("batch_size") != recommended.get("batch_size"):
        from . import hf

        return hf.batch_note(base, recommended, config)
    if name == "lightning" and base.get("batch_size") != recommended.get("batch_size"):
        from . import lightning

        return lightning.batch_note(base, recommended, config)
    return None


# Where each framework's configuration (results.json `workload.framework.config`) holds its gradient accumulation.
ACCUMULATION = {"hf": ("args", "gradient_accumulation_steps"), "lightning": ("trainer_args", "accumulate_grad_batches")}


def accumulation_steps(framework: dict[str, Any] | None) -> int | None:
    """The micro-batches per optimizer step the user's framework configuration sets, which a batch-size change
    rescales to keep the effective batch (batch_note); None for a plain workload."""
    from .common import steps

    name, config = _parts(framework)
    if name not in ACCUMULATION:
        return None
    section, key = ACCUMULATION[name]
    values = config.get(section)
    return steps(values.get(key) if isinstance(values, dict) else None)


def _parts(framework: Any) -> tuple[str | None, dict[str, Any]]:
    """(name, config) of results.json `workload.framework`, forgiving of a hand-edited file."""
    if not isinstance(framework, dict):
        return None, {}
    config = framework.get("config")
    return framework.get("name"), config if isinstance(config, dict) else {}
