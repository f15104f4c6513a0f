"""What a compile probe is reckoned to spend compiling (planner/compile_cost.py): an earlier run's record on this
machine, else a guess; and a plan that affords compile on a record where the guess would not."""

from __future__ import annotations

import json

import pytest
import torch

from tune_advisor import knobs
from tune_advisor.planner import compile_cost
from tune_advisor.probe.result import ProbeResult, Status

from .planning import CPU_NO_BF16, FUSED_MLP, run_plan

SHA = "ab" * 32


def compiled(seconds: float | None, mode: str = "default", status: Status = Status.OK) -> ProbeResult:
    result = ProbeResult("p002", knobs.full_settings({"compile": mode}), status)
    if seconds is not None:
        result.extra["compile"] = {"compile_s": seconds}
    return result


def test_without_a_record_a_compile_is_reckoned_at_the_guess_and_says_so():
    seconds, why = compile_cost.allowance(SHA, "cpu", "default")
    assert seconds == compile_cost.GUESS_S and "a guess" in why
    assert compile_cost.allowance(None, "cpu", "default")[0] == compile_cost.GUESS_S  # no workload file known


def test_a_run_records_its_shortest_compile_and_the_next_run_reckons_twice_it():
    # GIVEN a run whose first compiled probe compiled 21 s (a cold cache), a later one 4.2 s, a third 9 s
    recorder = compile_cost.Recorder(SHA, "cpu")
    for seconds in (21.0, 4.2, 9.0):
        recorder.saw(compiled(seconds))
    # THEN the next run reckons twice the shortest, and says where that comes from
    seconds, why = compile_cost.allowance(SHA, "cpu", "default")
    assert seconds == pytest.approx(8.4) and "4.2 s an earlier compile took here" in why
    # AND a new run's first compile replaces the old record, even where it took longer (the cache may be gone)
    compile_cost.Recorder(SHA, "cpu").saw(compiled(12.0))
    assert compile_cost.allowance(SHA, "cpu", "default")[0] == pytest.approx(24.0)


def test_a_record_applies_only_to_its_workload_torch_device_and_mode(own_compile_record):
    compile_cost.Recorder(SHA, "cpu").saw(compiled(2.0))
    assert compile_cost.allowance(SHA, "cpu", "default")[0] == pytest.approx(4.0)
    for other in (("cd" * 32, "cpu", "default"), (SHA, "cuda", "default"), (SHA, "cpu", "max-autotune")):
        assert compile_cost.allowance(*other)[0] == compile_cost.GUESS_S
    # another torch compiles anew: its key differs
    assert json.loads(own_compile_record.read_text()) == {f"{SHA}:{torch.__version__}:cpu:default": 2.0}


def test_probes_without_a_measured_compile_record_nothing_and_a_broken_record_is_a_guess(own_compile_record):
    recorder = compile_cost.Recorder(SHA, "cpu")
    for result in (compiled(None), compiled(3.0, status=Status.OOM), compiled(3.0, mode="off")):
        recorder.saw(result)
    assert not own_compile_record.exists()
    own_compile_record.write_text("{not json")
    assert compile_cost.allowance(SHA, "cpu", "default")[0] == compile_cost.GUESS_S
    recorder.saw(compiled(3.0))  # and the next compile writes a good one over it
    assert compile_cost.allowance(SHA, "cpu", "default")[0] == pytest.approx(6.0)


def test_a_minute_tries_compile_where_an_earlier_runs_compile_fits_and_not_on_the_guess():
    # GIVEN raw_sensor_mlp's shape on a minute: the fused optimizer 1.17x, compile 1.1x on top, 1.5 s of compiling
    def rate(s):
        return {"rate": 1000.0 * (1.1 if s["compile"] == "default" else 1.0) * (
            1.17 if s["optimizer_impl"] == "fused" else 1.0), "compile_s": 1.5}

    def plan():
        return run_plan(rate, workload=FUSED_MLP, device=CPU_NO_BF16, search={"batch_size": [16]}, budget_s=60,
                        explore=("compile", "optimizer_impl"), lockstep=True, wall_s=4.0, workload_sha256=SHA)

    # WHEN nothing is recorded: the guess's 30 s do not fit behind the fused optimizer
    outcome, backend = plan()
    assert not any(c["compile"] != "off" for c in backend.calls)
    assert any(u.startswith("compile=default: over budget (its compiling reckoned at 30 s, a guess")
               for u in outcome.unexplored)
    # WHEN an earlier run recorded its 1.5 s
    compile_cost.Recorder(SHA, "cpu").saw(compiled(1.5))
    outcome, backend = plan()
    # THEN compile is measured on top of the fused optimizer, and kept
    assert any(c["compile"] == "default" and c["optimizer_impl"] == "fused" for c in backend.calls)
    assert outcome.recommended.settings["compile"] == "default"


def test_a_compile_recorded_cheap_goes_before_a_knob_that_pays_less_for_what_it_costs():
    # GIVEN hf_transformer's shape on a minute at batch 32: compile 1.16x, the optimizer's steps 4% of the compute
    # (its fused form 1.00x), 4 s probes, 4.2 s of compiling
    def rate(s):
        return {"rate": 1000.0 * (1.16 if s["compile"] == "default" else 1.0), "compile_s": 4.2, "optimizer": 0.04}

    def plan():
        return run_plan(rate, workload=FUSED_MLP, device=CPU_NO_BF16, search={"batch_size": [16]}, budget_s=60,
                        explore=("compile", "optimizer_impl"), lockstep=True, wall_s=4.0, workload_sha256=SHA)

    def first_changed(backend):
        return next(c for c in backend.calls if c["compile"] != "off" or c["optimizer_impl"] != "default")

    # WHEN nothing is recorded: compile's 30 s guess costs more than its prospect over the fused optimizer's pays
    _, backend = plan()
    assert first_changed(backend)["optimizer_impl"] == "fused"
    # WHEN an earlier run recorded its 4.2 s: compile (1.15x at most, over an 8 s duel and 8.4 s) goes before the
    # fused optimizer (1.04x at most, over a duel), and is kept
    compile_cost.Recorder(SHA, "cpu").saw(compiled(4.2))
    outcome, backend = plan()
    assert first_changed(backend)["compile"] == "default" and first_changed(backend)["optimizer_impl"] == "default"
    assert outcome.recommended.settings["compile"] == "default"
