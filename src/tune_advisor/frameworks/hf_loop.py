"""The Hugging Face Trainer's own loop run for a probe: `trainer.train()` with the probe's settings written as
TrainingArguments fields (hf.py `arguments`, the one table between knobs and fields, handed in by the adapter) and
a TrainerCallback that reports each micro-batch's end to the probe and stops training when the probe has its steps.
Imported in the probe child only (transformers and torch are loaded there).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import TrainerCallback

from .. import knobs
from .common import LoopProbe, OptimizerStep

MAX_STEPS = 10 ** 9  # training runs until the probe stops it, over as many epochs as that takes
# What a probe sets whatever the user's arguments say: evaluation, checkpoints and reporting are not training steps
# (an evaluation inside the measured window would time the evaluation), and what the Trainer writes goes to the
# probe's scratch folder.
PROBE_FIELDS = {"save_strategy": "no", "eval_strategy": "no", "report_to": "none", "load_best_model_at_end": False,
                "push_to_hub": False, "max_steps": MAX_STEPS}
NOT_HERE = ("ddp_bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "ddp_backend")  # one process: no DDP


class ProbeCallback(TrainerCallback):
    """Each micro-batch's end to the probe (a step of `cycle`, the optimizer stepping at the last), with the loss the
    Trainer accumulated over the cycle, when it keeps one; training stops when the probe says so. A cycle's first
    step carries the fetch of all its batches (the Trainer reads them before the cycle): the probe's noise and
    window are judged over whole cycles."""

    def __init__(self, trainer: Any, probe: LoopProbe, cycle: int):
        self.trainer, self.probe, self.cycle = trainer, probe, cycle
        self.loss_before = 0.0

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.probe.started(train_dataloader, self.cycle)

    def on_substep_end(self, args, state, control, **kwargs):
        if self.probe.step_ended(None):
            control.should_training_stop = True
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.probe.step_ended(self._loss()):
            control.should_training_stop = True
        return control

    def _loss(self) -> float | None:
        # The Trainer's running loss sum (reset at each logging step, hence the guard): this step's mean loss.
        total = getattr(self.trainer, "_tr_loss", None)
        if not isinstance(total, torch.Tensor):
            return None
        now = float(total.detach())
        step, self.loss_before = now - self.loss_before, now
        return step if step >= 0 else None  # training_step returns each micro-loss over the accumulation


def fields(arguments: Callable, settings: dict[str, Any], config: dict[str, Any], device_type: str,
           rule: OptimizerStep, field_names: set[str]) -> tuple[dict[str, Any], list[str]]:
    """(the TrainingArguments fields for `settings`, the knobs no field holds). The gradient accumulation keeps the
    user's effective batch, as the recommendation writes it."""
    found: dict[str, Any] = {}
    rest = []
    for knob in knobs.KNOBS:
        if knob not in settings or knob in NOT_HERE:
            continue
        held, code = arguments(knob, settings[knob], config)
        found.update(held)
        if code:
            rest.append(knob)
    found["gradient_accumulation_steps"] = rule.every(settings["batch_size"])
    if device_type != "cuda":  # TrainingArguments refuses tf32 without a GPU that has it; the matmul knob is global
        found.pop("tf32", None)
        found["use_cpu"] = True
    if settings["num_workers"] == 0:  # the worker-only fields are refused without workers
        found.update(dataloader_prefetch_factor=None, dataloader_persistent_workers=False)
    if "activation_checkpointing" in field_names:  # transformers 5: gradient_checkpointing is its alias
        found["activation_checkpointing"] = found["gradient_checkpointing"]
    return found, rest


def run(arguments: Callable, trainer: Any, supplied: bool, config: dict[str, Any], rule: OptimizerStep,
        settings: dict[str, Any], device: str, probe: LoopProbe, scratch: Path) -> dict[str, Any]:
    """trainer.train() for one probe (see common.Loop)."""
    device_type = torch.device(device).type
    names = {f.name for f in dataclasses.fields(trainer.args)}
    found, rest = fields(arguments, settings, config, device_type, rule, names)
    probe_fields = {k: v for k, v in PROBE_FIELDS.items() if k in names}
    trainer.args = dataclasses.replace(trainer.args, **found, **probe_fields, output_dir=str(scratch / "trainer"))
    trainer.create_accelerator_and_postprocess()  # the Trainer's own set-up from its arguments (precision, compile)
    trainer._train_batch_size = trainer.args.train_batch_size
    applied = {"training_arguments": {k: v for k, v in found.items() if k != "use_cpu"}}
    if "channels_last" in rest or "cudnn_benchmark" in rest:
        applied.update(probe.prepare_model(trainer.model))
    if not supplied:
        trainer.optimizer = None  # train() builds it from the arguments (optim), as in the user's run
    if "optimizer_impl" in rest:  # no field holds it: the user's optimizer, or the one the arguments build, rebuilt
        trainer.optimizer = probe.optimizer_impl(trainer.optimizer or trainer.create_optimizer())
    trainer.add_callback(ProbeCallback(trainer, probe, found["gradient_accumulation_steps"]))
    trainer.train()
    return applied
