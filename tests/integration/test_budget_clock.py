"""One clock: --budget bounds the whole analysis, calibration and reports included, on any machine."""

from __future__ import annotations

import time

from tune_advisor import api, results
from tune_advisor.collectors import flops

from ..conftest import FAST, WORKLOADS


def test_a_calibration_that_would_stall_gets_a_share_of_the_budget_and_the_report_is_complete(tmp_path, monkeypatch):
    # GIVEN a machine whose peak calibration would run for minutes (bf16 only emulated): it takes all it is given
    given = []

    def slow_calibration(device, timeout_s=flops.PEAK_TIMEOUT_S):
        given.append(timeout_s)
        time.sleep(timeout_s)
        return None, f"error: measuring the peak took over {timeout_s:g} s"

    monkeypatch.setattr(flops, "ensure_peaks", slow_calibration)
    # WHEN an analysis runs with a 10 s budget
    started = time.monotonic()
    result = api.analyze(WORKLOADS / "tiny_mlp.py", api.AnalyzeOptions(
        out=tmp_path / "out", device="cpu", protocol=FAST, budget="10s", only_knobs=["batch_size"]))
    took = time.monotonic() - started
    # THEN the calibration got a tenth of the budget, and the whole run ended within the budget plus a few seconds
    assert given == [1.0]
    assert took < 10 + 5, took
    saved = results.read(result.results_path)
    assert saved["run"]["state"] == "complete" and saved["budget"]["used_s"] <= 10
    assert saved["environment"]["peaks"]["status"].startswith("error: measuring the peak took over 1 s")
    assert (result.out_dir / "report.html").exists() and (result.out_dir / "report.md").exists()


def test_a_budget_shorter_than_the_work_still_ends_with_a_complete_report(tmp_path):
    # GIVEN a budget too short for more than the first probe or two
    started = time.monotonic()
    result = api.analyze(WORKLOADS / "tiny_mlp.py", api.AnalyzeOptions(out=tmp_path / "out", device="cpu",
                                                                       protocol=FAST, budget="6s"))
    took = time.monotonic() - started
    # THEN it ends within the budget plus a few seconds with a report; what the budget cut is "stopped", not failed
    assert took < 6 + 6, took
    saved = results.read(result.results_path)
    assert saved["run"]["state"] == "complete"
    assert (result.out_dir / "report.html").exists()
    assert not [p for p in saved["probes"] if p["status"] == "timeout"]


def test_an_operator_without_a_kernel_for_a_knob_is_unsupported_not_a_failure(tmp_path):
    # WHEN the channels_last probe of a CNN hits a convolution with no kernel for that layout
    result = api.analyze(WORKLOADS / "no_channels_last_kernel.py", api.AnalyzeOptions(
        out=tmp_path / "out", device="cpu", protocol=FAST, budget="60s", only_knobs=["channels_last"]))
    saved = results.read(result.results_path)
    # THEN that probe is unsupported, naming the operator, the layer and the knob; TA803 explains it
    missing = [p for p in saved["probes"] if p["settings"]["channels_last"]]
    assert missing and {p["status"] for p in missing} == {"unsupported"}
    assert missing[0]["error"].startswith("convolution (in Net) has no kernel here for channels_last=true")
    assert "TA803" in {f["code"] for f in saved["findings"]}
    assert saved["recommended"]["settings"]["channels_last"] is False
    # AND the reports do not list it among failed probes
    md = (result.out_dir / "report.md").read_text()
    assert "### Failed probes" not in md and "### Unsupported on this machine" in md
