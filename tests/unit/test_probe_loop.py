"""A framework's own loop measured (probe/loop.py): the batches timed where torch's DataLoader hands them out, and
the probe's side of the loop (warm-up, measured steps, the stopping rule, a diverging loss), driven here by hand as
trainer.train() or Trainer.fit() would drive it."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tune_advisor import knobs
from tune_advisor.probe import evidence
from tune_advisor.probe.loop import Fetches, LoopSteps
from tune_advisor.probe.training import Diverged

from ..conftest import FAST
from ..fakes import fake_spec


def result() -> dict:
    return {"status": "ok", "error": None, "raw": evidence.empty_raw(), "applied": {}, "extra": {}}


def test_fetches_count_the_batches_items_and_epochs_the_loop_reads():
    loader = DataLoader(TensorDataset(torch.zeros(10, 3)), batch_size=4)
    fetches = Fetches(lambda batch: float(len(batch[0])))
    fetches.install()
    try:
        for _ in range(2):
            for _ in loader:
                pass
    finally:
        fetches.remove()
    wait, items, new_epoch = fetches.take()
    assert items == 20 and fetches.epochs == 2 and new_epoch and wait >= 0
    assert fetches.shapes == {(3,)}
    for _ in loader:  # removed: no longer counted
        pass
    assert fetches.take()[1] == 0


def steps_for(protocol=FAST) -> tuple[LoopSteps, dict]:
    spec = dataclasses.replace(fake_spec("p001", knobs.full_settings({})), protocol=protocol, device="cpu")
    out = result()
    return LoopSteps(spec, out, lambda phase: None, Fetches(lambda batch: 1.0)), out


def test_the_loop_is_warmed_up_then_measured_until_the_stopping_rule_says_stop():
    steps, out = steps_for()
    steps.started(DataLoader(TensorDataset(torch.zeros(4, 1))), cycle=2)
    ended = 0
    while not steps.step_ended(1.0):
        time.sleep(0.005)
        ended += 1
        assert ended < 1000
    # warm-up and the window are whole cycles of 2; the window is closed and every measured step recorded
    assert out["extra"]["warmup_steps"] % 2 == 0 and len(out["raw"]["step_s"]) % 2 == 0
    assert len(out["raw"]["step_s"]) >= FAST.min_steps and steps.window.spent is not None
    assert steps.step_ended(1.0)  # a step the loop runs after the stop: stop again


def test_a_non_finite_loss_ends_the_loop_as_diverged():
    steps, out = steps_for()
    steps.started(DataLoader(TensorDataset(torch.zeros(4, 1))), cycle=1)
    with pytest.raises(Diverged, match="loss became nan"):
        steps.step_ended(math.nan)
    assert out["raw"]["loss"] == [None]


def test_a_step_before_the_loop_started_is_named():
    steps, _ = steps_for()
    with pytest.raises(RuntimeError, match="before it started"):
        steps.step_ended(1.0)


def test_the_first_step_is_timed_from_the_loops_start_as_it_holds_compiling():
    # a Trainer compiles (and starts its loader) inside its first step: untimed, TA504 read 0.01 s of compiling
    # where each compiled hf_trainer probe ran 9-13 s longer than its uncompiled twin
    steps, out = steps_for()
    steps.started(DataLoader(TensorDataset(torch.zeros(4, 1))), cycle=1)
    time.sleep(0.2)  # the first step: compiling
    ended = 0
    while not steps.step_ended(1.0):
        ended += 1
        assert ended < 1000
    first, *rest = out["extra"]["warmup_step_s"]
    assert first >= 0.2 and all(s < 0.2 for s in rest)
    assert len(out["extra"]["warmup_step_s"]) == out["extra"]["warmup_steps"]
