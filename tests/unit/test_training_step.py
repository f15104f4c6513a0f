"""The probe's training step under a framework's optimizer step (frameworks/common.py OptimizerStep): the optimizer
steps once per accumulation cycle, over gradients clipped as the framework clips them, and the measured window
covers whole cycles. Runs probe/training.py in this process on a tiny model."""

from __future__ import annotations

import textwrap

import pytest
import torch

from tune_advisor import knobs, workload
from tune_advisor.frameworks import OptimizerStep
from tune_advisor.probe import evidence, training
from tune_advisor.probe.result import ProbeResult, Status
from tune_advisor.probe.spec import ProbeSpec, Protocol

WORKLOAD = """
import torch
from torch import nn

STEPS = []  # per optimizer step: the norm of the gradients it was handed


class Counting(torch.optim.SGD):
    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        STEPS.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        return super().step(closure)


def build_model():
    return nn.Linear(16, 1)


def build_dataset():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(100 * torch.randn(512, 16, generator=g), torch.randn(512, 1, generator=g))


def build_optimizer(params):
    return Counting(params, lr=1e-6)


def compute_loss(model, batch):
    inputs, targets = batch
    return torch.nn.functional.mse_loss(model(inputs), targets)
"""
PROTOCOL = Protocol(warmup_steps=3, min_steps=10, min_time_s=0.0, max_steps=10, max_time_s=5.0)


def run(tmp_path, monkeypatch, rule: OptimizerStep | None, batch_size: int = 8) -> tuple[dict, list[float]]:
    """One in-process probe of the workload above with the framework rule `rule`; (its result, optimizer steps)."""
    path = tmp_path / "workload.py"
    path.write_text(textwrap.dedent(WORKLOAD))
    loaded = workload.load(path)
    loaded.optimizer_step = rule
    loaded.module.STEPS.clear()
    monkeypatch.setattr(workload, "load", lambda p: loaded)
    spec = ProbeSpec(id="p1", workload=str(path), settings=knobs.full_settings({"batch_size": batch_size}),
                     protocol=PROTOCOL, count_flops=False)
    out = {"status": "ok", "error": None, "raw": evidence.empty_raw(), "applied": {}, "extra": {}}
    training.train(spec, lambda phase: None, out)
    return out, list(loaded.module.STEPS)


def test_a_plain_workload_steps_the_optimizer_after_every_batch(tmp_path, monkeypatch):
    out, steps = run(tmp_path, monkeypatch, None)
    measured = len(out["raw"]["step_s"])
    assert len(steps) == out["extra"]["warmup_steps"] + measured
    assert out["applied"]["optimizer_step"] == {"every": 1, "clip": None}


def test_accumulation_steps_the_optimizer_once_per_cycle_over_whole_cycles(tmp_path, monkeypatch):
    # GIVEN a Trainer that accumulates 4 batches of 8 (an effective batch of 32)
    out, steps = run(tmp_path, monkeypatch, OptimizerStep(batch_size=8, accumulate=4))
    warmup, measured = out["extra"]["warmup_steps"], len(out["raw"]["step_s"])
    # THEN warm-up and window are whole cycles (3 warm-up steps become 4), one optimizer step per cycle
    assert warmup == 4 and measured % 4 == 0 and measured >= 10
    assert len(steps) == (warmup + measured) // 4
    assert out["applied"]["optimizer_step"] == {"every": 4, "clip": None} and out["extra"]["optimizer_every"] == 4


def test_a_larger_batch_accumulates_what_keeps_the_effective_batch(tmp_path, monkeypatch):
    # the probe at batch 16 steps the optimizer every 2 batches: what the recommendation writes for that batch
    out, steps = run(tmp_path, monkeypatch, OptimizerStep(batch_size=8, accumulate=4), batch_size=16)
    assert out["applied"]["optimizer_step"]["every"] == 2
    assert len(steps) == (out["extra"]["warmup_steps"] + len(out["raw"]["step_s"])) // 2


@pytest.mark.parametrize("clip, bound", [("norm", 0.5), ("value", 0.01)])
def test_gradients_are_clipped_before_the_optimizer_steps(tmp_path, monkeypatch, clip, bound):
    # the inputs are large, so unclipped gradients are far above the bound
    _, unclipped = run(tmp_path, monkeypatch, OptimizerStep(batch_size=8))
    assert min(unclipped) > 10
    out, clipped = run(tmp_path, monkeypatch, OptimizerStep(batch_size=8, clip_value=bound, clip=clip))
    assert out["applied"]["optimizer_step"] == {"every": 1, "clip": f"{clip} {bound:g}"}
    # by norm: the total norm is the bound; by value: each of the 17 elements is at most the bound
    limit = bound if clip == "norm" else bound * 17 ** 0.5
    assert max(clipped) <= limit * (1 + 1e-5)


def test_the_result_repeats_over_loader_waves_and_accumulation_cycles_alike():
    def result(workers, every):
        return ProbeResult(id="p", settings=knobs.full_settings({"num_workers": workers}), status=Status.OK,
                           extra={"optimizer_every": every})
    assert result(0, 1).wave == 1 and result(2, 1).wave == 2 and result(0, 4).wave == 4
    assert result(2, 4).wave == 4 and result(3, 4).wave == 12
