"""What the reports show: the staircase of measured improvements, the verdict, and forgiving reads."""

from __future__ import annotations

import pytest

from tune_advisor import knobs, record
from tune_advisor.render import view

from ..conftest import golden


def probe(pid: str, role: str = "combine", status: str = "ok", median: float | None = 100.0, **changes) -> dict:
    settings = knobs.full_settings(changes)
    return {"id": pid, "role": role, "settings": settings, "status": status, "error": None,
            "throughput": {"median": median if status == "ok" else None, "ci_low": None, "ci_high": None,
                           "unit": "samples/s"},
            "step_time_s": {"median": 0.1, "iqr": 0.01, "samples": [0.1, 0.1]}, "data_wait_frac": 0.1,
            "peak_memory_bytes": 2**20, "gpu": None}


def document(probes: list[dict], baseline: dict, recommended: dict) -> dict:
    return {"schema_version": 1, "probes": probes, "baseline": baseline, "recommended": recommended,
            "speedup": None, "findings": [], "budget": {}}


def test_the_staircase_of_a_real_run_uses_the_probes_that_measured_each_prefix():
    steps = view.build(golden("cnn")).staircase
    assert [s.label for s in steps] == ["baseline", "+ amp=bf16", "+ channels_last=true", "+ batch_size=64"]
    assert [s.probe.id for s in steps] == ["p001", "p002", "p011", "p012"]
    assert steps[-1].ratio == golden("cnn")["probes"][11]["throughput"]["median"] / 225.6734252273541


def test_a_stair_no_probe_measured_says_not_measured_and_carries_no_number():
    # GIVEN a run that measured the baseline and amp+batch together, but neither change alone
    base = probe("p001", "baseline", median=100.0)
    both = probe("p002", median=300.0, amp="bf16", batch_size=64)
    steps = view.build(document([base, both], base, both)).staircase
    assert [s.label for s in steps] == ["baseline", "+ amp=bf16", "+ batch_size=64"]
    assert steps[1].probe is None and not steps[1].measured and steps[1].ratio is None
    assert steps[2].probe.id == "p002" and steps[2].ratio == 3.0


def test_the_staircase_prefers_the_order_that_was_measured():
    # GIVEN batch 64 alone was measured, amp alone was not: batch goes first, against the default order
    base = probe("p001", "baseline")
    bs = probe("p002", "ladder:batch_size", median=150.0, batch_size=64)
    both = probe("p003", median=300.0, amp="bf16", batch_size=64)
    steps = view.build(document([base, bs, both], base, both)).staircase
    assert [s.label for s in steps][1:] == ["+ batch_size=64", "+ amp=bf16"]
    assert all(s.measured for s in steps)


def test_a_failed_stair_is_shown_with_its_status():
    base = probe("p001", "baseline")
    oom = probe("p002", status="oom", batch_size=64)
    win = probe("p003", median=200.0, amp="bf16", batch_size=64)
    steps = view.build(document([base, oom, win], base, win)).staircase
    failed = next(s for s in steps if s.probe is not None and s.probe.id == "p002")
    assert not failed.measured and failed.ratio is None


def test_no_change_means_a_single_stair_and_a_keep_verdict():
    base = probe("p001", "baseline")
    report = view.build(document([base], base, base))
    assert [s.label for s in report.staircase] == ["baseline"]
    assert report.verdict.startswith("Keep your settings") and report.snippet is None


def test_the_verdict_says_how_the_confirmation_rounds_ran():
    base = probe("p001", "baseline")
    win = probe("p002", median=200.0, batch_size=64)
    doc = document([base, win], base, win)
    speedup = {"median": 2.0, "ci_low": 1.9, "ci_high": 2.1}
    # GIVEN rounds one side after the other (the quick start's io_bound): not called pairs measured together
    doc["speedup"] = {**speedup, "method": "baseline and recommended measured one after the other, in alternating "
                                           "order, 3 rounds"}
    assert view.build(doc).verdict.endswith("confirmed by measuring baseline and recommended again, one after the "
                                            "other in alternating rounds.")
    doc["speedup"] = {**speedup, "method": "baseline and recommended measured together in lockstep, step by step, "
                                           "8 rounds"}
    assert view.build(doc).verdict.endswith("again, together in lockstep rounds.")


def test_a_partial_document_still_builds():
    # GIVEN a run still going: no baseline chosen yet, a finding with nothing but its code
    report = view.build({"schema_version": 2, "probes": [probe("p001", "baseline")], "findings": [{"code": "TA101"}]})
    # THEN the first baseline probe stands in, and what is absent reads as a gap
    assert report.baseline.id == "p001" and len(report.rows) == 1 and report.speedup is None
    assert report.findings[0].code == "TA101" and report.findings[0].measured is None
    assert report.figures["recommended"] == {"median": None, "ci_low": None, "ci_high": None, "unit": "",
                                             "interval": "95% CI within one measured window (?)"}


def test_a_document_its_schema_rejects_is_not_rendered():
    with pytest.raises(record.ValidationError, match=r"probes\.0"):
        view.build({"schema_version": 2, "probes": [None, "junk", probe("p001", "baseline")]})
    with pytest.raises(record.ValidationError, match=r"findings\.0\.code"):
        view.build({"schema_version": 2, "probes": [], "findings": [{"code": 5}]})


def test_the_reproduce_command_names_the_tool_not_this_machines_path():
    assert view.build({"schema_version": 2, "command": ["/work/venv/bin/tune-advisor", "analyze", "my model.py"]}
                      ).command == "tune-advisor analyze 'my model.py'"
    assert view.build({"schema_version": 2, "command": ["/x/src/tune_advisor/__main__.py", "analyze", "m.py"]}
                      ).command == \
        "python -m tune_advisor analyze m.py"
