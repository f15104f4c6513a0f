"""The Hugging Face Trainer adapter: a workload file's `build_trainer()` returns a `transformers.Trainer`.

Probes run the Trainer's own loop, `trainer.train()` (hf_loop.py); its model, train_dataset, data collator,
optimizer and loss (`Trainer.compute_loss`, so a subclass's loss counts) serve inspection; the baseline is read from
its `TrainingArguments`, and the recommendation is written back as the TrainingArguments fields to change (`FIELDS`
and `arguments`: the one table between knobs and fields, which probes apply too). transformers is imported only
when such a file is loaded.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, Callable

from .. import knobs
from ..errors import WorkloadError
from .common import Adapted, Loop, OptimizerStep, accumulation, accumulation_note, literal, steps, plain, require

ENTRY = "build_trainer"
FIX_RETURN = "return the transformers.Trainer you would call .train() on from build_trainer()"

# Knobs held one to one by a TrainingArguments field.
FIELDS = {
    "batch_size": "per_device_train_batch_size",
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "checkpointing": "gradient_checkpointing",
    "ddp_bucket_cap_mb": "ddp_bucket_cap_mb",
}
# Knobs no TrainingArguments field holds: the code that applies them, added before trainer.train().
NO_FIELD = {
    "channels_last": "model.to(memory_format=torch.channels_last)  # no TrainingArguments field; 4-D inputs too: "
                     "x.contiguous(memory_format=torch.channels_last) in your collator",
    "cudnn_benchmark": "torch.backends.cudnn.benchmark = {value}  # no TrainingArguments field",
    "gradient_as_bucket_view": "# no TrainingArguments field: DDP's gradient_as_bucket_view={value} needs an "
                               "Accelerator with DistributedDataParallelKwargs",
    "static_graph": "# no TrainingArguments field: DDP's static_graph={value} needs an Accelerator with "
                    "DistributedDataParallelKwargs",
}
# The TrainingArguments fields read for the baseline and shown in the recommendation's diff.
ARGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "dataloader_num_workers",
        "dataloader_pin_memory", "dataloader_prefetch_factor", "dataloader_persistent_workers", "bf16", "fp16",
        "tf32", "torch_compile", "torch_compile_mode", "gradient_checkpointing", "optim", "ddp_bucket_cap_mb",
        "ddp_backend")
FUSED_OPTIM, FOREACH_OPTIM = "adamw_torch_fused", "adamw_torch"


def arguments(knob: str, value: Any, config: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The TrainingArguments fields that set `knob` to `value`, and the code to add where no field does."""
    if knob in FIELDS:
        return {FIELDS[knob]: value}, None
    if knob == "amp":
        return {"bf16": value == "bf16", "fp16": value == "fp16"}, None
    if knob == "matmul_precision":
        if value == "medium":  # TrainingArguments' tf32 knows only on and off
            return {}, 'torch.set_float32_matmul_precision("medium")  # no TrainingArguments field: bf16 inside ' \
                       "float32 matmuls"
        return {"tf32": value == "high"}, None
    if knob == "compile":
        if value == "off":
            return {"torch_compile": False}, None
        return {"torch_compile": True, **({} if value == "default" else {"torch_compile_mode": value})}, None
    if knob == "optimizer_impl":
        args = config.get("args")
        optim = str(args.get("optim") or "") if isinstance(args, Mapping) else ""
        if config.get("optimizer_source") == "args" and optim in (FUSED_OPTIM, FOREACH_OPTIM) and value != "foreach":
            return {"optim": FUSED_OPTIM if value == "fused" else FOREACH_OPTIM}, None
        return {}, (f"# no TrainingArguments field: build your optimizer with {value}=True and pass it as "
                    f"Trainer(..., optimizers=(optimizer, None))" if value != "default" else
                    "# build your optimizer without fused=/foreach= and pass it as Trainer(..., optimizers=...)")
    if knob == "ddp_backend":
        return {"ddp_backend": None if value == "auto" else value}, None
    if knob in NO_FIELD:
        return {}, NO_FIELD[knob].format(value=value)
    return {}, f"# {knob}={value}: no TrainingArguments field"


def baseline(args: Any, optimizer: Any) -> dict[str, Any]:
    """The knob values the user's TrainingArguments (and optimizer) set."""
    workers = int(args.dataloader_num_workers or 0)
    settings = {
        "batch_size": int(args.per_device_train_batch_size),
        "num_workers": workers,
        "pin_memory": bool(args.dataloader_pin_memory),
        "amp": "bf16" if args.bf16 else "fp16" if args.fp16 else "off",
        "matmul_precision": "high" if args.tf32 else "highest",
        "compile": (args.torch_compile_mode or "default") if args.torch_compile else "off",
        "checkpointing": bool(args.gradient_checkpointing),
        "optimizer_impl": optimizer_impl(optimizer),
    }
    if workers > 0:  # the worker-only loader arguments mean nothing without workers (knobs.LOADER_KNOBS)
        settings["persistent_workers"] = bool(args.dataloader_persistent_workers)
        settings["prefetch_factor"] = int(args.dataloader_prefetch_factor or knobs.KNOBS["prefetch_factor"].default)
    if getattr(args, "ddp_bucket_cap_mb", None):
        settings["ddp_bucket_cap_mb"] = int(args.ddp_bucket_cap_mb)
    return knobs.validate_settings(settings)


def optimizer_impl(optimizer: Any) -> str:
    """Which implementation the optimizer was built with: fused, foreach or default (torch picks)."""
    defaults = getattr(optimizer, "defaults", {}) or {}
    return "fused" if defaults.get("fused") else "foreach" if defaults.get("foreach") else "default"


def adapt(module: Any, shown: str, call: Callable):
    """The workload parts of the Trainer that `build_trainer()` returns (see frameworks.adapt)."""
    transformers = require("transformers", "hf", shown, ENTRY)
    require("accelerate", "hf", shown, ENTRY)  # transformers' Trainer refuses to run without it
    build = getattr(module, ENTRY)
    if not callable(build):
        raise WorkloadError(shown, f"{ENTRY} is a {type(build).__name__}, not a function", f"define def {ENTRY}(): "
                            "..., returning your transformers.Trainer")
    trainer = call(f"{ENTRY}()", build)
    if not isinstance(trainer, transformers.Trainer):
        raise WorkloadError(shown, f"{ENTRY}() returned a {type(trainer).__name__}, not a transformers.Trainer",
                            FIX_RETURN)
    if trainer.train_dataset is None:
        raise WorkloadError(shown, "the Trainer from build_trainer() has no train_dataset, so there is nothing to "
                                   "train on", "pass train_dataset=... to Trainer(...) in build_trainer()")
    dataset, collate = _training_data(trainer, transformers)
    supplied = trainer.optimizer is not None  # optimizers=(optimizer, scheduler) given to Trainer(...)
    optimizer = trainer.optimizer if supplied else trainer.create_optimizer()
    args = trainer.args
    config = {"args": {name: plain(getattr(args, name, None)) for name in ARGS},
              "optimizer_source": "optimizers=" if supplied else "args",
              "trainer_class": type(trainer).__name__}

    def build_optimizer(params):
        if supplied:  # the user's own optimizer, built over this same model's parameters
            return trainer.optimizer
        trainer.optimizer = None  # a fresh one per call, as TrainingArguments' optim and weight decay say
        return trainer.create_optimizer()

    from . import hf_loop  # here: the recommendation's renderers import this module without training anything

    def compute_loss(model, batch):  # inspection's first loss, and the FLOP counter's step
        model.train()
        return trainer.compute_loss(model, batch)

    rule = optimizer_step(args)
    first = _first_batch(dataset, collate, call)
    tokens = isinstance(first, Mapping) and "attention_mask" in first
    return Adapted(framework="hf", build_model=lambda: trainer.model, build_dataset=lambda: dataset,
                   compute_loss=compute_loss, build_optimizer=build_optimizer, collate_fn=collate,
                   count_items=count_tokens if tokens else None, item_name="tokens" if tokens else "samples",
                   baseline=baseline(args, optimizer), config=config, optimizer_step=rule,
                   loop=Loop(functools.partial(hf_loop.run, arguments, trainer, supplied, config, rule)))


def optimizer_step(args: Any) -> OptimizerStep:
    """The Trainer's optimizer step: every gradient_accumulation_steps micro-batches, after clipping the gradients'
    norm to max_grad_norm (1.0 unless set). With max_grad_norm 0 the Trainer does not clip but still computes the
    norm for its log (clip_grad_norm_ at an infinite bound), and so does a probe."""
    norm = getattr(args, "max_grad_norm", None)
    clip = float(norm) if isinstance(norm, (int, float)) and norm > 0 else math.inf
    return OptimizerStep(int(args.per_device_train_batch_size), steps(args.gradient_accumulation_steps), clip)


def _training_data(trainer: Any, transformers: Any) -> tuple[Any, Callable]:
    """The dataset and collator as Trainer.get_train_dataloader prepares them (unused columns removed)."""
    dataset, collate = trainer.train_dataset, trainer.data_collator
    try:
        import datasets  # installed with transformers' data tooling, not always
    except ImportError:
        datasets = None
    if datasets is not None and isinstance(dataset, datasets.Dataset) and hasattr(trainer, "_remove_unused_columns"):
        dataset = trainer._remove_unused_columns(dataset, description="training")
    elif hasattr(trainer, "_get_collator_with_removed_columns"):
        collate = trainer._get_collator_with_removed_columns(collate, description="training")
    return dataset, collate


def _first_batch(dataset: Any, collate: Callable, call: Callable) -> Any:
    """One collated sample: whether batches carry attention_mask (then throughput counts tokens)."""
    from torch.utils.data import IterableDataset  # torch's Dataset has __getitem__ even where it is iterable

    def first():
        iterable = isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__")
        return collate([next(iter(dataset)) if iterable else dataset[0]])

    return call("reading the Trainer's first training sample", first)


def count_tokens(batch: Any) -> int:
    """Non-padding tokens of a batch: the attention mask's sum."""
    return int(batch["attention_mask"].sum())


def recommendation(base: Mapping[str, Any], recommended: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The TrainingArguments fields to change, as a diff, then the code for knobs no field holds."""
    old_args = config.get("args") if isinstance(config.get("args"), Mapping) else {}
    changes = {k: v for k, v in recommended.items() if base.get(k) != v}
    fields: dict[str, Any] = {}
    code: list[str] = []
    for knob in knobs.KNOBS:
        if knob not in changes:
            continue
        found, add = arguments(knob, changes[knob], config)
        fields.update(found)
        if add:
            code.append(add)
    comment = {}
    if all(isinstance(s.get("batch_size"), int) and s["batch_size"] > 0 for s in (base, changes)):
        old_accum = steps(old_args.get("gradient_accumulation_steps"))
        accum, kept = accumulation(base["batch_size"], old_accum, changes["batch_size"])
        fields = _after(fields, "per_device_train_batch_size", "gradient_accumulation_steps", accum)
        effective = base["batch_size"] * old_accum
        comment["gradient_accumulation_steps"] = (f"keeps the effective batch of {effective}" if kept else
                                                  f"effective batch {effective} → {changes['batch_size'] * accum}")
    lines = ["# TrainingArguments(...): change these fields, keep the rest as you have them"]
    for name, value in fields.items():
        old = old_args.get(name)
        if name in old_args and old == value:
            continue
        note = f"  # {comment[name]}" if name in comment else ""
        lines += [f"- {name}={literal(old)}," if name in old_args else f"- ({name} not set)",
                  f"+ {name}={literal(value)},{note}"]
    if code:
        lines += ["# and before trainer.train():", *code]
    return "\n".join(lines)


def _after(fields: dict[str, Any], anchor: str, name: str, value: Any) -> dict[str, Any]:
    """`fields` with name=value placed right after `anchor` (the diff shows related fields together)."""
    out: dict[str, Any] = {}
    for key, existing in fields.items():
        out[key] = existing
        if key == anchor:
            out[name] = value
    out.setdefault(name, value)
    return out


def batch_note(base: Mapping[str, Any], recommended: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
    old, new = base.get("batch_size"), recommended.get("batch_size")
    if not isinstance(old, int) or not isinstance(new, int) or old <= 0 or new <= 0:
        return None
    args = config.get("args") if isinstance(config.get("args"), Mapping) else {}
    return accumulation_note(old, steps(args.get("gradient_accumulation_steps")), new,
                             "gradient_accumulation_steps")
