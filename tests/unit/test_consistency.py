"""Every shipped results document agrees with itself: as written, and with its findings evaluated anew."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tune_advisor.consistency import contradictions, shown_contradictions
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


def test_a_findings_code_writing_another_batch_or_worker_count_is_a_contradiction():
    # GIVEN a recommendation of 32 workers at batch 32, and findings whose code writes loader arguments
    doc = copy.deepcopy(json.loads((ROOT / "tests" / "golden" / "io_bound.results.json").read_text()))
    doc["recommended"]["settings"].update(num_workers=32, batch_size=32)
    code = "loader = DataLoader(dataset, batch_size={b}, shuffle=True, num_workers={w})"
    doc["findings"] = [
        # advice on the workers written at 16 (the README's quick start had this), and a code at another batch
        {"code": "TA102", "message": "past 16 workers compete", "fix": {"settings": {"num_workers": 16},
                                                                        "snippet": code.format(b=32, w=16)}},
        {"code": "TA104", "message": "pinned memory", "fix": {"settings": {}, "snippet": code.format(b=128, w=32)}},
        # a next step the run did not try, and TA703's batch advice: no contradiction
        {"code": "TA103", "message": "persistent workers, not tried in this run",
         "fix": {"settings": {"num_workers": 64}, "snippet": code.format(b=32, w=64)}},
        {"code": "TA703", "message": "scale the learning rate", "fix": {"settings": {}, "snippet": code.format(b=64, w=32)}},
        # code that agrees, and code of another knob with a fix of its own
        {"code": "TA101", "message": "input-bound", "fix": {"settings": {"num_workers": 32},
                                                            "snippet": code.format(b=32, w=32)}},
        {"code": "TA301", "message": "a larger batch fits", "fix": {"settings": {"amp": "bf16"},
                                                                    "snippet": code.format(b=64, w=32)}},
    ]
    # THEN exactly the two disagreeing codes are named
    found = [f for f in contradictions(doc) if "'s code sets" in f]
    assert found == ["TA102's code sets num_workers=16, the recommendation has num_workers=32",
                     "TA104's code sets batch_size=128, the recommendation has batch_size=32"]


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


# --- one figure per comparison, as the reports show it ------------------------------------------------------------

REPORTS = sorted([*ROOT.glob("reports/*/report.html"), *ROOT.glob("reports/gpu/*/report.html")])


@pytest.mark.parametrize("path", RUNS + SYNTHETIC, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_rendered_report_shows_one_figure_per_comparison(path):
    from tune_advisor.render import html

    page = html.render(json.loads(path.read_text()))
    assert shown_contradictions(page) == []


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_report_shows_one_figure_per_comparison(path):
    page = path.read_text(encoding="utf-8")
    assert 'data-change="recommended"' in page  # rendered since figures were marked: the check has something to read
    assert shown_contradictions(page) == []


def test_the_check_names_a_report_showing_two_figures_for_one_comparison():
    verdict = '<div data-change="recommended" data-speedup="2.2283">2.23x</div>'
    stairs = '<td data-change="amp=bf16" data-speedup="2.1306">2.13x</td><td data-change="recommended" ' \
             'data-speedup="1.6800">1.68x</td>'
    finding = '<span data-change="amp=bf16" data-speedup="1.3700">measured 1.37x</span>'
    assert shown_contradictions(verdict + stairs + finding) == ["recommended is shown as 1.68 and 2.23x",
                                                                 "amp=bf16 is shown as 1.37 and 2.13x"]
    assert shown_contradictions(verdict + '<td data-change="recommended" data-speedup="2.2299">') == []
