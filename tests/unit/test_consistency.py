"""Every shipped results document agrees with itself: as written, and with its findings evaluated anew."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tune_advisor.consistency import contradictions
from tune_advisor.planner import figures
from tune_advisor.rules import evaluate

ROOT = Path(__file__).resolve().parents[2]
RUNS = sorted([*ROOT.glob("reports/*/results.json"), *ROOT.glob("reports/gpu/*/results.json"),
               *ROOT.glob("tests/golden/*.results.json")])  # real runs
# Hand-made documents (tests/golden/rules/derive.py) plant findings on settings no run would recommend beside them.
SYNTHETIC = sorted(ROOT.glob("tests/golden/rules/*.results.json"))


@pytest.mark.parametrize("path", RUNS + SYNTHETIC, ids=lambda p: str(p.relative_to(ROOT)))
def test_recommendation_and_findings_agree_as_written(path):
    assert contradictions(json.loads(path.read_text())) == []


@pytest.mark.parametrize("path", RUNS, ids=lambda p: str(p.relative_to(ROOT)))
def test_recommendation_and_findings_agree_as_the_rules_read_them_now(path):
    document = json.loads(path.read_text())
    assert contradictions({**document, "findings": evaluate(document)}) == []


def test_the_check_finds_each_kind_of_contradiction():
    doc = json.loads((ROOT / "tests" / "golden" / "cnn.results.json").read_text())
    doc = copy.deepcopy(doc)
    doc["recommended"]["settings"].update(compile="default", amp="bf16")
    doc["baseline"]["settings"].update(compile="off", amp="off")
    doc["findings"] = [
        {"code": "TA504", "message": "torch.compile (default) did not train faster: 1.00x; leave it off",
         "fix": {"settings": {}}},
        {"code": "TA702", "message": "with amp=bf16 the loss differs from float32 by 30%", "fix": {"settings": {}}},
        {"code": "TA101", "message": "input-bound", "fix": {"settings": {"amp": "off"}}},
    ]
    doc["probes"][0]["throughput"]["median"] = None
    found = contradictions(doc)
    assert any(f.startswith("TA504 advises against compile") for f in found)
    assert any(f.startswith("TA702 questions amp") for f in found)
    assert any(f.startswith("TA101 fixes amp=off") for f in found)
    assert any("without a throughput" in f for f in found)


def test_a_speedup_beside_an_unchanged_recommendation_is_a_contradiction():
    # GIVEN a report that keeps the baseline yet states the speedup of the candidate its confirmation rejected
    doc = copy.deepcopy(json.loads((ROOT / "tests" / "golden" / "cnn.results.json").read_text()))
    doc["recommended"] = copy.deepcopy(doc["baseline"])
    doc["speedup"] = {"median": 1.32, "ci_low": 0.94, "ci_high": 1.85}
    # THEN the check names it; with no speedup the same report agrees with itself
    assert any("keeps the baseline, yet the speedup reads 1.32x" in f for f in contradictions(doc))
    assert not any("speedup" in f for f in contradictions({**doc, "speedup": None}))



def test_a_next_step_called_untried_that_a_probe_measured_is_a_contradiction_and_the_rules_no_longer_write_it():
    # GIVEN the first run on a real GPU (an H200, at 52f5b61; tests/golden/gpu/ keeps it as written): TA104 called
    # pin_memory=true "a next step, not tried in this run", where p012 had measured it and the planner not kept it
    doc = json.loads((ROOT / "tests" / "golden" / "gpu" / "h200_cnn.results.json").read_text())
    assert "TA104 calls pin_memory=True not tried in this run, yet p012 measured it" in contradictions(doc)
    # THEN its findings evaluated now name the probe, leave the fix without the knob, and agree with the run
    fresh = evaluate(doc)
    ta104 = next(f for f in fresh if f["code"] == "TA104")
    assert "pin_memory=true was measured in this run (p012) and the planner did not keep it" in ta104["message"]
    assert "pin_memory" not in ta104["fix"]["settings"] and "not tried" not in ta104["message"]
    # (its figures too, as planner/figures.py works them out now: written before, they read 2.34x beside 2.81x)
    assert contradictions({**doc, "findings": fresh, "figures": figures.of_document(doc)}) == []
