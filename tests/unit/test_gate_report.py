"""The gate's outputs, read back by real consumers: JUnit XML by junitparser, Markdown by markdown-it-py."""

from __future__ import annotations

import io

import junitparser
import pytest
from markdown_it import MarkdownIt
from rich.console import Console

from tune_advisor.gate import report

HOSTILE = "</td><script>alert(1)</script> | *x* `y`"


def gate_document(verdict: str = "fail", **over) -> dict:
    doc = {
        "verdict": verdict, "created": "2026-11-22T04:00:00+00:00", "workload": {"path": "models/train_me.py"},
        "reference": {"kind": "baseline", "path": "perf/baseline.json", "created": "2026-11-01T00:00:00+00:00"},
        "reason": None, "settings": {"batch_size": 64, "num_workers": 0, "amp": "off"},
        "environment": {"cpu_model": "Xeon", "cpu_count": 2, "torch": "2.13.0", "gpu": None},
        "checks": [
            {"check": "throughput:5%", "status": "fail",
             "message": "throughput dropped 13.0% (allowed 5%): ratio 0.870x over 5 paired rounds "
                        "(95% CI 0.860–0.880); levels 870 samples/s vs 1,000 samples/s (each side's mean over "
                        "its rounds)"},
            {"check": "peak_memory:10%", "status": "pass", "message": "peak memory changed +1.0%"},
            {"check": "step_time:<=50ms", "status": "error", "message": f"no usable step samples {HOSTILE}"},
        ],
        "warnings": [f"the baseline was measured with other settings {HOSTILE}"],
    }
    doc.update(over)
    return doc


def refused_document() -> dict:
    return gate_document("refused", reason="perf/baseline.json was recorded on different hardware (CPU cores: 16 "
                                           "(baseline) vs 2 (here))",
                         checks=[{"check": "throughput:5%", "status": "not run", "message": "refused"}], warnings=[])


def test_junit_is_read_by_junitparser_with_one_testcase_per_check(tmp_path):
    # GIVEN a gate with a regression, a pass and a check that could not be evaluated
    path = tmp_path / "gate.xml"
    path.write_text(report.junit(gate_document()))
    # WHEN a JUnit consumer reads the file
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = list(xml)
    cases = {case.name: case for case in suites[0]}
    # THEN it sees three tests: one failure carrying the numbers, one error, one pass
    assert (suites[0].tests, suites[0].failures, suites[0].errors) == (3, 1, 1)
    assert set(cases) == {"throughput:5%", "peak_memory:10%", "step_time:<=50ms"}
    failure = cases["throughput:5%"].result[0]
    assert isinstance(failure, junitparser.Failure)
    assert "870 samples/s vs 1,000 samples/s" in failure.message and "0.860–0.880" in failure.message
    assert isinstance(cases["step_time:<=50ms"].result[0], junitparser.Error)
    assert HOSTILE in cases["step_time:<=50ms"].result[0].message  # escaped in XML, intact when read
    assert cases["peak_memory:10%"].is_passed
    assert cases["throughput:5%"].classname == "tune_advisor.gate.train_me"


def test_a_refusal_is_an_error_in_junit_not_a_pass(tmp_path):
    path = tmp_path / "refused.xml"
    path.write_text(report.junit(refused_document()))
    suite = list(junitparser.JUnitXml.fromfile(str(path)))[0]
    assert (suite.tests, suite.errors) == (1, 1)


def _html(markdown: str) -> str:
    return MarkdownIt("commonmark").enable("table").render(markdown)


def test_markdown_renders_a_table_with_one_row_per_check_and_no_live_html():
    # GIVEN a failing gate whose messages contain HTML, pipes and Markdown punctuation
    html = _html(report.markdown(gate_document()))
    # WHEN a Markdown parser renders the step summary
    # THEN the headline, a table of 3 rows x 3 cells, and no injected element come out
    assert "<h3>❌ tune-advisor gate: regression found</h3>" in html
    body = html.split("<tbody>")[1].split("</tbody>")[0]
    rows = body.split("<tr>")[1:]
    assert len(rows) == 3 and all(row.count("<td>") == 3 for row in rows)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<code>throughput:5%</code>" in html
    assert "warning: the baseline was measured with other settings" in html


@pytest.mark.parametrize("document, headline", [
    (gate_document("pass", checks=gate_document()["checks"][1:2], warnings=[]), "✅ tune-advisor gate: passed"),
    (refused_document(), "tune-advisor gate: refused: the baseline is from other hardware"),
])
def test_markdown_headline_follows_the_verdict(document, headline):
    html = _html(report.markdown(document))
    assert f"{headline}</h3>" in html


def test_terminal_verdict_lists_every_check_and_warning():
    # GIVEN a failing gate  WHEN printed to a terminal
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    report.terminal(gate_document(), console)
    text = console.file.getvalue()
    # THEN the verdict, each check with its status, and the warnings are shown
    assert text.startswith("gate regression found — models/train_me.py vs baseline perf/baseline.json")
    for word in ("throughput:5%", "fail", "peak_memory:10%", "pass", "step_time:<=50ms", "error", "warning:"):
        assert word in text
