"""Framework adapters: a Hugging Face `Trainer` or a Lightning module handed over as the workload (docs/frameworks.md).

`kind_of` says which contract a workload file follows, from the functions it defines; `adapt` turns the user's
framework object into the plain workload's parts (model, dataset, loss, optimizer, baseline). The adapters import
their framework only when a file of that kind is loaded, so the core never imports transformers or lightning.
"""

from __future__ import annotations

import difflib
import importlib.machinery
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from .common import Adapted, Loop, LoopProbe, OptimizerStep

__all__ = ["Adapted", "Loop", "LoopProbe", "OptimizerStep", "ENTRY", "adapt", "batch_note", "install_hint", "kind_of",
           "misspelled_entry", "modules", "recommendation"]

# The entry function that marks each kind, in the order they are checked after the plain contract
# (build_model/build_dataset), which always wins.
ENTRY = {"lightning": "build_module", "hf": "build_trainer"}
PLAIN = ("build_model", "build_dataset")
# The frameworks' packages, and the tune-advisor extra that installs each.
EXTRAS = {"transformers": "hf", "accelerate": "hf", "lightning": "lightning", "pytorch_lightning": "lightning"}
# What a probe of each kind imports besides torch: the framework (the Trainer's module pulls in most of
# transformers; the Lightning adapter takes both of Lightning's packages where installed) and the adapter.
MODULES = {"hf": ("transformers", "transformers.trainer", f"{__name__}.hf", f"{__name__}.hf_loop"),
           "lightning": ("lightning.pytorch", "pytorch_lightning", f"{__name__}.lightning",
                         f"{__name__}.lightning_loop", f"{__name__}.lightning_step")}


def kind_of(module: ModuleType) -> str | None:
    """"hf" or "lightning" when the file hands over a framework object, None for the plain contract (or none)."""
    return kind_named({name for name in (*PLAIN, *ENTRY.values()) if hasattr(module, name)})


def kind_named(names: set[str]) -> str | None:
    """`kind_of` a module defining `names` (also the names a file binds, parsed: workload.framework_of)."""
    if names & set(PLAIN):
        return None
    return next((kind for kind, entry in ENTRY.items() if entry in names), None)


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


def modules(framework: dict[str, Any] | None, workload: str | Path) -> list[str]:
    """The modules a probe of the `workload` file (results.json `workload.framework`; None: a plain one) imports that
    its parent process can import once for all probes (ProbeSpec.preload): seconds each, otherwise paid by every
    probe. Nothing where the file's folder holds a package of the framework's (or of tune_advisor): the child puts that
    folder first on its path (workload.load), so it imports the folder's, and the adapters import the framework."""
    name, _ = _parts(framework)
    wanted = MODULES.get(name, ())
    packages = {module.split(".")[0] for module in wanted} | {package for package, extra in EXTRAS.items()
                                                               if extra == name}
    folder = [str(Path(workload).parent)]
    if any(importlib.machinery.PathFinder.find_spec(package, folder) for package in packages):
        return []
    return list(wanted)


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
