"""The Lightning adapter: a workload file's `build_module()` returns a `LightningModule`.

Probes run Lightning's own loop, a real `Trainer.fit` (lightning_loop.py); the module's parts (its
`training_step`, the optimizer from `configure_optimizers`, the dataset and collate function of its
`train_dataloader()` or of `build_datamodule()`'s) serve inspection. The baseline comes from that
DataLoader's arguments and from `TRAINER_ARGS`, the file's copy of the `Trainer(...)` arguments it trains with
(precision, accumulate_grad_batches, benchmark); the recommendation is written as Trainer(...) and DataLoader(...)
arguments (`PRECISION`, `LOADER`, `CODE`, `arguments`: the one table between knobs and Lightning). lightning and
torch are imported only when such a file is loaded (lightning_step.py holds what runs in the probe), so the
reports render without them.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Mapping
from typing import Any, Callable

from .. import knobs
from ..errors import WorkloadError
from .common import Adapted, Loop, OptimizerStep, accumulation, accumulation_note, literal, steps, require

ENTRY = "build_module"
# Trainer(precision=...) values and the amp knob they mean; "32"/32 are Lightning's older spellings.
PRECISION = {"32-true": "off", "32": "off", 32: "off", "bf16-mixed": "bf16", "16-mixed": "fp16", "16": "fp16",
             16: "fp16"}
AMP_PRECISION = {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
# Knobs held by a DataLoader argument of the same name (in train_dataloader()).
LOADER = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
# Knobs no Trainer or DataLoader argument holds: the code that applies them.
CODE = {
    "matmul_precision": 'torch.set_float32_matmul_precision("{value}")  # before trainer.fit()',
    "compile": "model = torch.compile(model{mode})  # then trainer.fit(model): Lightning trains the compiled module",
    "channels_last": "self.to(memory_format=torch.channels_last)  # in the module's on_fit_start(); 4-D inputs too: "
                     "x = x.contiguous(memory_format=torch.channels_last) in training_step",
    "checkpointing": "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)  # in forward(), for each "
                     "repeated block",
    "optimizer_impl": "# in configure_optimizers(): build the optimizer with {value}=True",
}


def arguments(knob: str, value: Any) -> tuple[str, dict[str, Any] | str]:
    """Where `knob`=`value` goes: ("trainer", {argument: value}), ("loader", {argument: value}) or ("code", text)."""
    if knob == "amp":
        return "trainer", {"precision": AMP_PRECISION.get(value, str(value))}
    if knob == "cudnn_benchmark":
        return "trainer", {"benchmark": value}
    if knob in LOADER:
        return "loader", {knob: value}
    if knob in ("ddp_bucket_cap_mb", "gradient_as_bucket_view", "static_graph"):
        name = "bucket_cap_mb" if knob == "ddp_bucket_cap_mb" else knob
        return "code", f"strategy = DDPStrategy({name}={value!r})  # Trainer(strategy=strategy)"
    if knob == "ddp_backend":
        return "code", f"strategy = DDPStrategy(process_group_backend={value!r})  # Trainer(strategy=strategy)"
    if knob == "compile":
        return "code", CODE["compile"].format(mode="" if value == "default" else f', mode="{value}"')
    if knob == "optimizer_impl" and value == "default":
        return "code", "# in configure_optimizers(): build the optimizer without fused=/foreach="
    return "code", CODE.get(knob, f"# {knob}={value}").format(value=value)


def adapt(module: Any, shown: str, call: Callable) -> Adapted:
    """The workload parts of the LightningModule that `build_module()` returns (see frameworks.adapt)."""
    from . import lightning_loop
    from .lightning_step import LightningStep, compute_loss, first_optimizer

    pl = _lightning(shown)
    build = getattr(module, ENTRY)
    if not callable(build):
        raise WorkloadError(shown, f"{ENTRY} is a {type(build).__name__}, not a function",
                            f"define def {ENTRY}(): ..., returning your LightningModule")
    lm = call(f"{ENTRY}()", build)
    if not isinstance(lm, pl.modules):
        raise WorkloadError(shown, f"{ENTRY}() returned a {type(lm).__name__}, not a lightning LightningModule",
                            f"return your LightningModule instance from {ENTRY}()")
    trainer_args = _trainer_args(module, shown)
    # training_step run by hand (a DDP probe's loop, probe/training.py) has no Trainer: its self.log() has none to
    # log to, and Lightning warns about it on every call site.
    warnings.filterwarnings("ignore", message=r".*self\.log\(\)`? but the `self\.trainer` reference")
    loader = _train_loader(module, lm, pl, shown, call)
    if loader.batch_size is None:
        raise WorkloadError(shown, "train_dataloader() builds its batches with a batch_sampler, so there is no "
                                   "batch_size to tune", "pass batch_size=... to the DataLoader in train_dataloader()")
    if callable(getattr(lm, "configure_model", None)):  # Lightning calls it before configure_optimizers
        call("the module's configure_model()", lm.configure_model)
    step = LightningStep(lm, shown)
    rule = optimizer_step(loader.batch_size, trainer_args, shown)
    package = next(p for p in pl.packages if isinstance(lm, p.LightningModule))
    # Inspection runs one step of Lightning's own loop: a module may read its Trainer (self.trainer, manual
    # optimization's self.optimizers()), so a step by hand cannot check it. Its Trainer's optimizers are the facts.
    first = lightning_loop.FirstStep(package, lm, loader, trainer_args, shown)
    loop = Loop(functools.partial(lightning_loop.run, arguments, package, lm, loader, trainer_args, rule),
                first_step=first)

    def build_optimizer(params):
        return first.optimizers[0] if first.optimizers else first_optimizer(lm, shown)

    return Adapted(framework="lightning", build_model=lambda: step, build_dataset=lambda: loader.dataset,
                   compute_loss=compute_loss, build_optimizer=build_optimizer,
                   collate_fn=loader.collate_fn, count_items=None, item_name="samples",
                   baseline=baseline(loader, trainer_args, shown),
                   config={"trainer_args": {k: v for k, v in trainer_args.items() if _jsonable(v)},
                           "module_class": type(lm).__name__,
                           "dataloader_from": "build_datamodule()" if hasattr(module, "build_datamodule") else
                           "train_dataloader()",
                           "automatic_optimization": bool(lm.automatic_optimization)},
                   optimizer_step=rule, loop=loop)


class _Packages:
    """The LightningModule and LightningDataModule classes of each installed Lightning package: `lightning` (2.x)
    and the older `pytorch_lightning` both ship them, and a module may subclass either."""

    def __init__(self, packages: list):
        self.packages = packages
        self.modules = tuple(p.LightningModule for p in packages)
        self.datamodules = tuple(p.LightningDataModule for p in packages)


def _lightning(shown: str) -> _Packages:
    packages = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            packages.append(importlib.import_module(name))
        except ImportError:
            continue
    if not packages:
        require("lightning", "lightning", shown, ENTRY)  # raises, naming the extra
    return _Packages(packages)


def _trainer_args(module: Any, shown: str) -> dict[str, Any]:
    raw = getattr(module, "TRAINER_ARGS", None)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise WorkloadError(shown, f"TRAINER_ARGS is a {type(raw).__name__}, not a dict",
                            'write TRAINER_ARGS = {"precision": "bf16-mixed", ...} (your Trainer(...) arguments)')
    precision = raw.get("precision", "32-true")
    if precision not in PRECISION:
        raise WorkloadError(shown, f"TRAINER_ARGS precision={precision!r} is not one the advisor probes",
                            f"use one of {', '.join(repr(p) for p in AMP_PRECISION.values())}")
    return dict(raw)


def _train_loader(module: Any, lm: Any, pl: Any, shown: str, call: Callable):
    """The training DataLoader: build_datamodule()'s when the file defines it, else the module's own."""
    from torch.utils.data import DataLoader

    if hasattr(module, "build_datamodule"):
        if not callable(module.build_datamodule):
            raise WorkloadError(shown, f"build_datamodule is a {type(module.build_datamodule).__name__}, not a "
                                       "function", "define def build_datamodule(): ..., returning your DataModule")
        source = call("build_datamodule()", module.build_datamodule)
        if not isinstance(source, pl.datamodules):
            raise WorkloadError(shown, f"build_datamodule() returned a {type(source).__name__}, not a "
                                       "LightningDataModule", "return your LightningDataModule instance")
        owner = "the DataModule"
    else:
        source, owner = lm, "the module"
        if any(type(lm).train_dataloader is base.train_dataloader for base in pl.modules):
            raise WorkloadError(shown, "the LightningModule defines no train_dataloader(), and the file no "
                                       "build_datamodule()", "define train_dataloader() in the module, or "
                                "build_datamodule() returning a LightningDataModule beside build_module()")
    call(f"{owner}'s prepare_data()", source.prepare_data)
    call(f"{owner}'s setup('fit')", source.setup, "fit")
    loader = call(f"{owner}'s train_dataloader()", source.train_dataloader)
    if not isinstance(loader, DataLoader):
        raise WorkloadError(shown, f"train_dataloader() returned a {type(loader).__name__}, not one DataLoader",
                            "return a single torch.utils.data.DataLoader from train_dataloader()")
    return loader


def optimizer_step(batch_size: int, trainer_args: Mapping[str, Any], shown: str) -> OptimizerStep:
    """Lightning's optimizer step from TRAINER_ARGS: every accumulate_grad_batches batches, after clipping by
    gradient_clip_val (gradient_clip_algorithm "norm", Lightning's default, or "value")."""
    clip_value = trainer_args.get("gradient_clip_val")
    algorithm = str(trainer_args.get("gradient_clip_algorithm") or "norm")
    if algorithm not in ("norm", "value"):
        raise WorkloadError(shown, f"TRAINER_ARGS gradient_clip_algorithm={algorithm!r} is not one Lightning knows",
                            'use "norm" or "value"')
    if clip_value is not None and (not isinstance(clip_value, (int, float)) or isinstance(clip_value, bool)):
        raise WorkloadError(shown, f"TRAINER_ARGS gradient_clip_val={clip_value!r} is not a number",
                            "write gradient_clip_val as a number (or leave it out: no clipping)")
    return OptimizerStep(int(batch_size), steps(trainer_args.get("accumulate_grad_batches")),
                         float(clip_value) if clip_value else None, algorithm)


def baseline(loader: Any, trainer_args: Mapping[str, Any], shown: str) -> dict[str, Any]:
    """The knob values the user's DataLoader and Trainer arguments set."""
    settings = {"batch_size": loader.batch_size, "num_workers": loader.num_workers,
                "pin_memory": bool(loader.pin_memory),
                "amp": PRECISION[trainer_args.get("precision", "32-true")],
                "cudnn_benchmark": bool(trainer_args.get("benchmark") or False)}
    if loader.num_workers > 0:
        settings["persistent_workers"] = bool(loader.persistent_workers)
        settings["prefetch_factor"] = int(loader.prefetch_factor or knobs.KNOBS["prefetch_factor"].default)
    try:
        return knobs.validate_settings(settings)
    except ValueError as exc:
        raise WorkloadError(shown, f"the training DataLoader's settings: {exc}", "fix train_dataloader()") from None


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def recommendation(base: Mapping[str, Any], recommended: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The Trainer(...) and DataLoader(...) arguments to change, as a diff, then code for the knobs neither holds."""
    trainer_old = config.get("trainer_args") if isinstance(config.get("trainer_args"), Mapping) else {}
    changes = knobs.changes(recommended, base)
    trainer, loader, code = {}, {}, []
    for knob in knobs.KNOBS:
        if knob in changes:
            where, what = arguments(knob, changes[knob])
            if where == "code":
                code.append(what)
            else:
                (trainer if where == "trainer" else loader).update(what)
    comment = {}
    if _batch_sizes(base, changes) and config.get("automatic_optimization", True):  # manual: Lightning cannot
        old_accum = steps(trainer_old.get("accumulate_grad_batches"))
        accum, kept = accumulation(base["batch_size"], old_accum, changes["batch_size"])
        effective = base["batch_size"] * old_accum
        if accum != old_accum:
            trainer["accumulate_grad_batches"] = accum
            comment["accumulate_grad_batches"] = (f"keeps the effective batch of {effective}" if kept else
                                                  f"effective batch {effective} → {changes['batch_size'] * accum}")
    old_trainer = {"precision": AMP_PRECISION.get(base.get("amp"), "32-true"), "benchmark": base.get(
        "cudnn_benchmark"), "accumulate_grad_batches": 1, **trainer_old}
    lines = []
    if trainer:
        lines.append("# Trainer(...): change these arguments, keep the rest as you have them")
        lines += _diff(trainer, old_trainer, comment)
    if loader:
        lines.append("# DataLoader(...) in train_dataloader(): change these arguments")
        lines += _diff(loader, {k: base.get(k) for k in LOADER}, {})
    if code:
        lines += ["# and in your code:", *code]
    return "\n".join(lines)


def _batch_sizes(base: Mapping[str, Any], changes: Mapping[str, Any]) -> bool:
    """Whether both batch sizes are usable numbers (a hand-edited results.json may hold anything)."""
    return all(isinstance(s.get("batch_size"), int) and s["batch_size"] > 0 for s in (base, changes))


def _diff(new: Mapping[str, Any], old: Mapping[str, Any], comment: Mapping[str, str]) -> list[str]:
    lines = []
    for name, value in new.items():
        note = f"  # {comment[name]}" if name in comment else ""
        lines += [f"- {name}={literal(old.get(name))},", f"+ {name}={literal(value)},{note}"]
    return lines


def batch_note(base: Mapping[str, Any], recommended: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
    old, new = base.get("batch_size"), recommended.get("batch_size")
    if not isinstance(old, int) or not isinstance(new, int) or old <= 0 or new <= 0:
        return None
    if config.get("automatic_optimization", True) is False:
        ratio = new / old
        return (f"batch size {old} → {new}: the module steps its optimizers itself (manual optimization), so "
                f"Lightning accumulates nothing and each optimizer step sees {new} samples instead of {old}, which "
                f"changes the optimisation; scale the learning rate about {ratio:.3g}x (linear rule) or "
                f"{ratio ** 0.5:.3g}x (square root, Adam-style) and re-check convergence.")
    trainer_args = config.get("trainer_args") if isinstance(config.get("trainer_args"), Mapping) else {}
    return accumulation_note(old, steps(trainer_args.get("accumulate_grad_batches")), new,
                             "Trainer(accumulate_grad_batches)")
