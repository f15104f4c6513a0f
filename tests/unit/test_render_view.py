"""What the reports show: one figure per change (the staircase), the verdict, and forgiving reads."""

from __future__ import annotations

import pytest

from tune_advisor import knobs, record
from tune_advisor.render import charts, markdown, view
from tune_advisor.render import html as html_report

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


def ablated(doc: dict, **contributions: float) -> dict:
    """`doc` with a confirmed speedup of 3x (CI 2.8–3.2) and the ablation's contribution of each named knob."""
    rec = doc["recommended"]["settings"]
    doc["speedup"] = {"median": 3.0, "ci_low": 2.8, "ci_high": 3.2, "method": "in lockstep, 5 rounds"}
    doc["plan"] = {"ablation": [{"knob": k, "value": rec[k], "without": None, "probes": ["p010", "p011"],
                                 "contribution": {"median": c, "ci_low": c * 0.9, "ci_high": c * 1.1},
                                 "kept": True, "method": "in lockstep"} for k, c in contributions.items()]}
    return doc


def test_each_stair_is_a_kept_changes_own_contribution_and_the_rows_multiply_to_the_confirmed_speedup():
    # GIVEN amp and batch_size kept, the ablation measuring 2x and 1.25x, and a confirmed 3x
    base = probe("p001", "baseline", median=100.0)
    both = probe("p002", median=400.0, amp="bf16", batch_size=64)  # a probe median reading 4x: never a stair
    steps = view.build(ablated(document([base, both], base, both), amp=2.0, batch_size=1.25)).staircase
    # THEN each change shows its own figure, the interaction what their product leaves, then the confirmed 3x
    assert [(s.kind, s.label) for s in steps] == [("change", "+ amp=bf16"), ("change", "+ batch_size=64"),
                                                  ("rest", "interaction"), ("total", "recommended (confirmed)")]
    assert [s.figure["median"] for s in steps] == [2.0, 1.25, pytest.approx(1.2), 3.0]
    assert steps[-1].cumulative == 3.0 and steps[-1].figure["ci_low"] == 2.8
    assert "with and without amp=bf16" in steps[0].how and "in lockstep" in steps[-1].how


def test_a_change_the_ablation_did_not_measure_is_named_in_the_rest_never_given_a_guess():
    base = probe("p001", "baseline")
    both = probe("p002", median=300.0, amp="bf16", batch_size=64)
    steps = view.build(ablated(document([base, both], base, both), batch_size=1.5)).staircase
    assert [s.label for s in steps] == ["+ batch_size=64", "amp=bf16 and the interaction", "recommended (confirmed)"]
    assert steps[1].figure == {"median": 2.0} and "not measured on its own" in steps[1].how


def test_a_single_change_is_quoted_with_the_confirmed_speedup_its_own_comparison():
    base = probe("p001", "baseline")
    win = probe("p002", median=200.0, batch_size=64)
    report = view.build(ablated(document([base, win], base, win), batch_size=2.5))
    assert [s.figure["median"] for s in report.staircase] == [3.0, 3.0]


def test_changes_none_measured_on_its_own_are_one_confirmed_row_and_no_chart_repeats_a_figure():
    # GIVEN two changes the ablation measured neither of (a loader's workers and keeping them alive)
    base = probe("p001", "baseline")
    both = probe("p002", median=300.0, num_workers=8, persistent_workers=True)
    report = view.build(ablated(document([base, both], base, both)))
    # THEN the staircase is the confirmed row alone, and no chart draws it twice
    assert [(s.kind, s.figure["median"]) for s in report.staircase] == [("total", 3.0)]
    assert charts.waterfall_chart(report) is None
    # AND the text above the row says it is what the two bought together, not each one's own contribution
    assert "2 changes were not measured one at a time" in report.staircase_note
    assert "Each kept change's own contribution" not in report.staircase_note
    html = html_report.render(ablated(document([base, both], base, both)))
    assert "2 changes were not measured one at a time" in html and "Each kept change&#39;s own" not in html
    # AND one change measured by the confirmation itself draws no chart either (its bar would be the total's)
    win = probe("p002", median=200.0, batch_size=64)
    assert charts.waterfall_chart(view.build(ablated(document([base, win], base, win)))) is None


def test_the_staircase_legend_names_the_colours_it_draws_and_only_those():
    # GIVEN a change that pays, one that costs on its own, and their interaction
    base = probe("p001", "baseline")
    both = probe("p002", median=300.0, amp="bf16", batch_size=64)
    chart = charts.waterfall_chart(view.build(ablated(document([base, both], base, both), amp=4.0, batch_size=0.9)))
    assert "Blue:" in chart.caption and "red:" in chart.caption and "grey:" in chart.caption
    # AND without a costing change or an interaction, neither red nor grey is named
    chart = charts.waterfall_chart(view.build(ablated(document([base, both], base, both), amp=2.0, batch_size=1.5)))
    assert "Blue:" in chart.caption and "red" not in chart.caption and "grey" not in chart.caption


def test_a_finding_on_a_kept_change_quotes_the_staircases_figure():
    # GIVEN a rule's finding quoting its own probe ratio (1.37x) for amp=bf16, which the ablation measured at 2x
    base = probe("p001", "baseline")
    both = probe("p002", median=300.0, amp="bf16", batch_size=64)
    doc = ablated(document([base, both], base, both), amp=2.0, batch_size=1.25)
    doc["findings"] = [{"code": "TA401", "name": "fp32", "severity": "warning",
                        "message": "amp=bf16 trains 1.37x [1.25, 1.50] faster than float32",
                        "fix": {"settings": {"amp": "bf16"}, "snippet": ""},
                        "gain": {"measured": True, "speedup": {"median": 1.37, "ci_low": 1.25, "ci_high": 1.5},
                                 "time_saved_frac": 0.27}, "probes": ["p001", "p002"], "evidence": {}}]
    report = view.build(doc)
    finding, stair = report.findings[0], report.staircase[0]
    assert finding.speedup == stair.figure and finding.change == "amp=bf16"
    assert finding.message == "amp=bf16 trains 2.00x [1.80, 2.20] faster than float32"
    assert finding.time_saved_frac == pytest.approx(0.5)


def test_no_change_means_a_single_stair_and_a_keep_verdict():
    base = probe("p001", "baseline")
    report = view.build(document([base], base, base))
    assert report.staircase == [] and report.headline == ""
    assert report.verdict.startswith("Keep your settings") and report.snippet is None


@pytest.mark.parametrize("short", [False, True])
def test_a_winner_the_confirmation_could_not_tell_is_named_in_the_keep_verdict_with_what_it_measured(short):
    # GIVEN a complete run whose confirmation read batch 64 + channels_last at 1.14x [0.94, 1.38] in two lockstep
    # rounds (a 1-minute cnn run), the baseline kept; the budget ended the rounds, or they ran their course
    base = probe("p001", "baseline")
    win = probe("p009", median=114.0, batch_size=64, channels_last=True)
    doc = document([base, win], base, base)
    doc["unconfirmed"] = {"probe": "p009", "changes": {"batch_size": 64, "channels_last": True}, "budget_short": short,
                          "speedup": {"median": 1.14, "ci_low": 0.94, "ci_high": 1.38,
                                      "method": "baseline and recommended measured together in lockstep, step by "
                                                "step, 2 rounds"}}
    report = view.build(doc)
    # THEN the verdict keeps the settings, and says what was measured and how, and whether more time would tell
    said = ("Keep your settings for now: batch_size=64, channels_last=true measured 1.14x (95% CI 0.94–1.38) against "
            "them when measured again together in lockstep rounds, not beyond the noise")
    assert report.verdict == said + ("; a longer --budget would measure more rounds." if short else ".")
    assert report.changes == {} and report.snippet is None and report.headline == ""
    # AND the markdown report leads with it
    assert f"**{markdown.escape(said)}" in markdown.render(doc)


def test_a_finding_on_the_change_the_confirmation_could_not_tell_quotes_the_verdicts_figure():
    # GIVEN a 1-minute cnn run: its confirmation read channels_last 1.10x [0.99, 1.19], the baseline kept, and TA501
    # quoting its own figure for channels_last over all the probes, 1.03x [1.01, 1.07]
    base = probe("p001", "baseline")
    win = probe("p014", median=110.0, channels_last=True)
    doc = document([base, win], base, base)
    doc["unconfirmed"] = {"probe": "p014", "changes": {"channels_last": True}, "budget_short": True,
                          "speedup": {"median": 1.10, "ci_low": 0.99, "ci_high": 1.19,
                                      "method": "baseline and recommended measured together in lockstep, 4 rounds"}}
    doc["findings"] = [{"code": "TA501", "name": "channels-last-unused", "severity": "warning",
                        "message": "channels_last=True trains 1.03x [1.01, 1.07] faster (7 conv layers)",
                        "fix": {"settings": {"channels_last": True}, "snippet": ""},
                        "gain": {"measured": True, "speedup": {"median": 1.03, "ci_low": 1.01, "ci_high": 1.07},
                                 "time_saved_frac": 0.03}, "probes": ["p001", "p014"], "evidence": {}}]
    report = view.build(doc)
    # THEN the finding shows the confirmation's figure, the one the verdict quotes, and says where it comes from
    finding = report.findings[0]
    assert finding.message == "channels_last=True trains 1.10x [0.99, 1.19] faster (7 conv layers)"
    assert finding.speedup == {"median": 1.10, "ci_low": 0.99, "ci_high": 1.19}
    assert finding.basis.startswith("the confirmation, not beyond the noise") and "1.10x (95% CI 0.99–1.19)" in \
        report.verdict
    # AND a finding on another change keeps its own figure
    doc["unconfirmed"]["changes"] = {"channels_last": True, "batch_size": 64}
    assert view.build(doc).findings[0].message.startswith("channels_last=True trains 1.03x [1.01, 1.07]")


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


def test_an_interrupted_runs_verdict_gives_its_best_so_far_as_not_confirmed():
    # GIVEN a run stopped before its confirmation, whose best so far was batch 128 at 1.42x [1.21, 1.66]
    doc = golden("cnn")
    doc.update(recommended=None, speedup=None)
    doc["best_so_far"] = {"probe": "p007", "changes": {"batch_size": 128},
                          "gain": {"median": 1.42, "ci": [1.21, 1.66]}, "confirmed": False}
    # THEN the verdict says what it was, that it is not confirmed, and how to finish
    verdict = view.build(doc).verdict
    assert "no recommendation yet" in verdict
    assert "Best so far, not confirmed: batch_size=128, 1.42x (95% CI 1.21–1.66) against the baseline (p007)" \
        in verdict and "--resume" in verdict
    # AND where nothing had beaten the baseline, it says that instead
    doc["best_so_far"] = {"probe": "p001", "changes": {}, "gain": {"median": 1.0, "ci": [1.0, 1.0]},
                          "confirmed": False}
    assert view.build(doc).verdict.endswith("Nothing had beaten the baseline when it stopped.")


def test_a_running_runs_verdict_says_the_run_goes_on_to_confirm_its_best_so_far():
    # GIVEN a run still going (its results.json saved after a probe), whose best so far is batch 128
    doc = golden("cnn")
    doc.update(recommended=None, speedup=None)
    doc["run"] = {"state": "running", "resumed": []}
    doc["best_so_far"] = {"probe": "p007", "changes": {"batch_size": 128},
                          "gain": {"median": 1.42, "ci": [1.21, 1.66]}, "confirmed": False}
    # THEN the verdict gives it as provisional and says the run goes on, not how to resume one
    verdict = view.build(doc).verdict
    assert "Best so far, not confirmed: batch_size=128" in verdict and "the run goes on to confirm it" in verdict
    assert "--resume" not in verdict
    doc["best_so_far"].update(probe="p001", changes={})
    assert view.build(doc).verdict.endswith("Nothing has beaten the baseline yet.")


# --- a plan the budget cut: what more time would have tried, and the thorough plan's command ---------------------


def test_a_plan_the_budget_cut_says_what_more_time_would_have_tried_and_the_command_of_the_thorough_plan():
    # GIVEN a 3-minute run that left compile=default over budget and skipped amp, matmul_precision and
    # optimizer_impl for their reasons
    doc = golden("io_bound_quickstart")
    more = view.build(doc).more_time
    # THEN more time would have tried compile=default, none of the reasoned skips, and the command is the user's with
    # --budget 10m in place of their 3m
    assert more.untried == ["compile=default"] and more.budget == "10m"
    assert more.command == "tune-advisor analyze fixtures/io_bound.py -o reports/io_bound --budget 10m --device auto " \
                           "--quiet"
    assert more.lead == "More time would have tried: compile=default. For the thorough plan, run:"
    assert not any(knob in more.text for knob in ("amp", "matmul_precision", "optimizer_impl"))


def test_a_plan_that_ended_on_its_own_has_no_more_time_line():
    # GIVEN a run whose unexplored entries are all the plan's own reasons (past the throughput plateau)
    doc = golden("cnn")
    assert doc["budget"]["unexplored"]
    assert view.build(doc).more_time is None


def test_a_run_given_ten_minutes_already_is_offered_twice_its_budget():
    doc = golden("io_bound_quickstart")
    doc["budget"]["limit_s"] = 900.0
    doc["command"] = ["tune-advisor", "analyze", "m.py", "--budget=15m", "-o", "out"]
    assert view.build(doc).more_time.command == "tune-advisor analyze m.py --budget=30m -o out"


def test_the_thorough_command_adds_the_budget_before_a_scripts_own_arguments():
    doc = golden("io_bound_quickstart")
    doc["command"] = ["tune-advisor", "analyze", "train.py", "--map", "amp=--precision:bf16", "--", "--budget", "1"]
    assert view.build(doc).more_time.command == \
        "tune-advisor analyze train.py --map amp=--precision:bf16 --budget 10m -- --budget 1"
    # AND a run through the API, which records no command, is told the option
    doc["command"] = []
    assert view.build(doc).more_time.text.endswith("For the thorough plan, run again with --budget 10m")


def test_the_more_time_line_names_the_first_few_settings_and_counts_the_rest():
    # GIVEN a plan cut before five knobs (one twice), and a grid's combination
    base = probe("p001", "baseline")
    doc = document([base], base, base)
    doc["budget"] = {"limit_s": 60.0, "unexplored": [f"{k}: over budget" for k in ("amp", "compile", "amp",
                                                                                   "channels_last", "batch_size",
                                                                                   "num_workers")]}
    assert view.build(doc).more_time.lead.startswith("More time would have tried: amp, compile, channels_last and 2 "
                                                     "more. ")
    doc["budget"]["unexplored"] = ["amp=bf16, batch_size=64: over budget", "compile=default: over budget"]
    assert view.build(doc).more_time.lead.startswith("More time would have tried: amp=bf16, batch_size=64; "
                                                     "compile=default. ")


def test_the_line_never_names_a_setting_the_report_shows_measured_and_the_settings_keep_a_knob_it_names():
    # GIVEN a re-opened worker ladder cut at 4 workers, which a probe measured; matmul_precision cut, its only
    # probe so far a value skipped as not applicable (on this CPU `high`; `medium` applies)
    base = probe("p001", "baseline")
    four = probe("p002", median=150.0, num_workers=4)
    skipped = probe("p003", "knob:matmul_precision", status="skipped", matmul_precision="high")
    doc = document([base, four, skipped], base, four)
    doc["budget"] = {"limit_s": 180.0, "unexplored": ["num_workers=4: over budget",
                                                      "matmul_precision: over budget"]}
    report = view.build(doc)
    # THEN the line names matmul_precision only, and the settings table lists it among the knobs that apply
    assert report.more_time.untried == ["matmul_precision"]
    assert "matmul_precision" in [row.knob for row in report.settings_rows]
    # AND without the cut it is hidden as not applicable, as before
    doc["budget"]["unexplored"] = []
    assert "matmul_precision" not in [row.knob for row in view.build(doc).settings_rows]


def test_mfu_comes_from_the_first_probe_of_the_settings_that_counted_its_flops():
    # GIVEN a recommendation whose own probe, a duel's recheck, counted no FLOPs, and the screen of the same settings
    # that did (re-measurements and confirmation rounds do not count them again: api/facade.counts_flops)
    base = probe("p001", "baseline")
    base["extra"] = {"flops": {"mfu": 0.02, "peak_dtype": "fp32"}}
    screen = probe("p002", "ladder:batch_size", median=200.0, batch_size=64)
    screen["extra"] = {"flops": {"mfu": 0.05, "peak_dtype": "fp32"}}
    recheck = probe("p003", "recheck", median=210.0, batch_size=64)
    report = view.build(document([base, screen, recheck], base, recheck))
    # THEN both sides' MFU are shown, the recommendation's from its screen
    assert report.mfu == [("baseline", "2.0% of the fp32 peak"), ("recommended", "5.0% of the fp32 peak")]
    # AND where no probe of the settings counted them, it says so
    report = view.build(document([base, recheck], base, recheck))
    assert report.mfu[1] == ("recommended", "not measured: no FLOP count recorded")
