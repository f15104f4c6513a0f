"""Loss parity between a speed knob's probe and its float32 twin (analysis/parity.py)."""

from types import SimpleNamespace

import pytest

from tune_advisor import knobs
from tune_advisor.analysis import parity


def test_identical_losses_agree_and_a_flat_loss_against_a_falling_one_does_not():
    falling = [2.0 - 0.05 * i for i in range(20)]
    assert parity.compare(falling, falling).difference == 0
    found = parity.compare(falling, [2.0] * 20)
    assert not found.ok and found.steps == 20
    assert found.difference == pytest.approx(sum(0.05 * i for i in range(20)) / (2.0 * 20))  # the larger: 2.0


def test_a_reference_that_learns_to_zero_against_one_stuck_at_chance_differs_by_about_all_of_it():
    found = parity.compare([0.01, 0.001, 0.0, 0.0], [0.69, 0.70, 0.69, 0.69])
    assert 0.95 < found.difference <= 1.0 and not found.ok


def test_rounding_differences_are_within_tolerance():
    base = [1.5 - 0.01 * i for i in range(30)]
    assert parity.compare(base, [x * 1.004 for x in base]).ok


def test_only_common_finite_steps_count_and_too_few_say_nothing():
    assert parity.compare([1.0, None, 1.0, 1.0], [1.0, 5.0, 1.0, 1.0, 9.0]).steps == 3
    assert parity.compare([1.0, 1.0], [1.0, 2.0]) is None
    assert parity.compare([0.0] * 5, [0.0] * 5) is None  # no scale to compare against


def test_reference_settings_put_every_numeric_knob_back_to_float32():
    settings = knobs.full_settings({"amp": "bf16", "compile": "default", "batch_size": 64})
    reference = parity.reference_settings(settings)
    assert reference == knobs.full_settings({"batch_size": 64})
    assert parity.numeric_changes(settings) == {"amp": "bf16", "compile": "default"}
    assert parity.numeric_changes(reference) == {}


# --- issue 20 item 3: losses are paired by global training step, not by position in the lists ---------------------

def loss_at(step: int) -> float:
    """The loss every float32-equivalent probe sees at global training step `step` (same seed, same batches)."""
    return 2.0 * 0.7 ** step + 0.1


def probe(warmup: int, measured: int, loss=loss_at, record_steps: bool = True, **settings) -> dict:
    """A PROBE dict whose measured steps follow `warmup` warm-up steps, as probe/evidence.py records them."""
    steps = list(range(warmup, warmup + measured))
    raw = {"loss": [loss(s) for s in steps]}
    if record_steps:
        raw["loss_step"] = [float(s) for s in steps]  # results.json holds numbers as floats
    return {"id": f"w{warmup}", "settings": settings, "status": "ok", "raw": raw, "extra": {"warmup_steps": warmup}}


def test_a_compiled_probe_that_warmed_up_longer_agrees_at_the_same_global_steps():
    # GIVEN a reference warmed up for 3 steps and a compiled twin warmed up for 6 (until compilation settled)
    reference, compiled = probe(3, 10), probe(6, 10, compile="default")
    # WHEN they are compared at the global steps both measured (6..12)
    found = parity.compare_probes(reference, compiled)
    # THEN they agree exactly
    assert found.ok and found.difference == 0 and found.steps == 7 and found.at == tuple(range(6, 13))
    assert found.reference == found.candidate == tuple(loss_at(s) for s in range(6, 13))
    # AND pairing by list position (the old comparison) would have flagged the same losses as a change
    assert not parity.compare(reference["raw"]["loss"], compiled["raw"]["loss"]).ok


def test_a_candidate_that_really_differs_at_the_same_steps_is_flagged():
    reference = probe(3, 10)
    stuck = probe(6, 10, loss=lambda s: loss_at(0), compile="default")  # never learns: stays at the first loss
    found = parity.compare_probes(reference, stuck)
    assert not found.ok and found.steps == 7 and found.at[0] == 6
    scaled = probe(3, 10, loss=lambda s: 1.2 * loss_at(s), amp="bf16")  # same warm-up, 20% off at every step
    assert parity.compare_probes(reference, scaled).difference == pytest.approx(0.2 / 1.2)


def test_a_longer_loader_warm_up_is_aligned_too():
    # 2 workers x prefetch 2 drain 4 warm-up steps; x prefetch 4, 8: the queue's backlog is not measured
    reference, candidate = probe(4, 30), probe(8, 30)
    found = parity.compare_probes(reference, candidate)
    assert found.ok and found.difference == 0 and found.at == tuple(range(8, 34))
    assert not parity.compare(reference["raw"]["loss"], candidate["raw"]["loss"]).ok


def test_results_saved_before_loss_step_are_aligned_by_their_warmup_steps():
    # GIVEN results.json probes written before raw.loss_step existed
    reference, compiled = probe(3, 10, record_steps=False), probe(6, 10, record_steps=False, compile="default")
    # THEN their measured steps are derived from extra.warmup_steps: they follow the warm-up without a gap
    assert parity.losses_by_step(compiled)[1] == list(range(6, 16))
    found = parity.compare_probes(reference, compiled)
    assert found.ok and found.at == tuple(range(6, 13))


def test_without_any_step_information_the_losses_are_paired_by_position():
    bare = {"raw": {"loss": [1.0, 0.9, 0.8]}}
    assert parity.losses_by_step(bare) == ([1.0, 0.9, 0.8], None)
    found = parity.compare_probes(bare, {"raw": {"loss": [1.0, 0.9, 0.8, 0.7]}})
    assert found.ok and found.steps == 3 and found.at is None
    # a loss_step list that does not match the losses is not trusted: extra.warmup_steps is used instead
    torn = {"raw": {"loss": [1.0, 0.9, 0.8], "loss_step": [5, 6]}, "extra": {"warmup_steps": 3}}
    assert parity.losses_by_step(torn)[1] == [3, 4, 5]


def test_too_few_common_steps_say_nothing():
    # measured steps 3..7 against 6..15: only steps 6 and 7 are common
    assert parity.compare_probes(probe(3, 5), probe(6, 10, compile="default")) is None
    # a non-finite loss at a common step does not count either
    assert parity.compare([1.0, None, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0, 1, 2, 3], [1, 2, 3, 4]) is None


def test_probe_results_are_read_like_probe_dicts():
    from tune_advisor.probe.result import ProbeResult, Status

    result = ProbeResult(id="p2", settings={}, status=Status.OK, raw={"loss": [loss_at(s) for s in range(6, 16)],
                                                                     "loss_step": list(range(6, 16))})
    assert parity.losses_by_step(result)[1] == list(range(6, 16))
    assert parity.compare_probes(probe(3, 10), result).ok
    assert parity.compare_probes(probe(3, 10), ProbeResult.from_dict(result.to_dict())).ok  # through JSON


def test_the_planner_does_not_bar_a_compile_whose_losses_agree_at_the_same_steps():
    from tune_advisor import knobs
    from tune_advisor.planner.base import Planner
    from tune_advisor.probe.result import ProbeResult

    def result(pid, warmup, loss=loss_at, **settings):
        return ProbeResult.from_dict({**probe(warmup, 10, loss=loss), "id": pid,
                                      "settings": knobs.full_settings(settings)})

    reference = result("p001", 3)

    class Seen:  # the session's ledger: its look-up of the float32 twin
        def seen(self, settings):
            return reference if settings == reference.settings else None

    planner = Planner(None, SimpleNamespace(ledger=Seen()))
    assert planner.changes_loss(result("p002", 6, compile="default")) is None and not planner.notes
    why = planner.changes_loss(result("p003", 6, loss=lambda s: 1.3 * loss_at(s), amp="bf16"))
    assert why.startswith("amp=bf16 changed the loss: over 7 measured steps") and "(p001 vs p003)" in why


def test_ta704_is_silent_on_a_compile_that_only_warmed_up_longer_and_fires_when_it_differs():
    import copy
    import json
    from pathlib import Path

    from tune_advisor.rules import evaluate

    golden = json.loads((Path(__file__).resolve().parents[1] / "golden" / "compile_varlen.results.json").read_text())

    def shifted(scale: float) -> dict:
        # GIVEN the compiled probe warmed up 3 steps longer: its losses are the reference's, 3 steps later
        doc = copy.deepcopy(golden)
        ref, on = (next(p for p in doc["probes"] if p["id"] == i) for i in ("p001", "p002"))
        losses = ref["raw"]["loss"]
        on["extra"]["warmup_steps"] = ref["extra"]["warmup_steps"] + 3
        on["raw"]["loss"] = [x * scale for x in losses[3:]]
        on["raw"]["loss_step"] = [on["extra"]["warmup_steps"] + i for i in range(len(losses) - 3)]
        return doc

    # THEN TA704 stays silent and TA504 judges the compile on its speed
    same = {f["code"]: f for f in evaluate(shifted(1.0))}
    assert "TA704" not in same and "changed the loss" not in same["TA504"]["message"]
    # AND a compiled probe 30% off at the same steps is still reported, with the steps it was compared at
    differs = {f["code"]: f for f in evaluate(shifted(1.3))}
    assert "compile=default" in differs["TA704"]["message"] and "changed the loss" in differs["TA504"]["message"]
    assert differs["TA704"]["evidence"]["global_steps"][0] == golden["probes"][0]["extra"]["warmup_steps"] + 3


def test_a_ddp_job_keeps_the_ranks_global_steps():
    from tune_advisor.distributed.merge import merge

    def rank(r):
        return {"rank": {"rank": r, "local_rank": r, "host": "h", "device": "cpu"}, "status": "ok",
                "raw": {"step_s": [0.1] * 3, "data_wait_s": [0.0] * 3, "h2d_s": [0.0] * 3, "items": [8] * 3,
                        "loss": [1.0 + r] * 3, "loss_step": [4, 5, 6]}, "extra": {"warmup_steps": 4}}

    merged = merge([rank(1), rank(0)])
    assert merged["raw"]["loss"] == [1.5] * 3 and merged["raw"]["loss_step"] == [4, 5, 6]


def test_a_value_barred_alone_is_barred_in_every_combination():
    from tune_advisor.analysis.parity import barred

    changed = {(("amp", "bf16"),): "bf16 changed the loss", (("compile", "default"), ("matmul_precision", "medium")):
               "that pair changed the loss"}
    base = {"batch_size": 64, "amp": "off", "compile": "off", "matmul_precision": "highest"}
    assert barred({**base, "amp": "bf16", "compile": "default"}, changed) == "bf16 changed the loss"
    assert barred({**base, "compile": "default", "matmul_precision": "medium"}, changed) == "that pair changed the loss"
    assert barred({**base, "compile": "default"}, changed) is None  # only its pair was barred, not the value alone
    assert barred(base, changed) is None
