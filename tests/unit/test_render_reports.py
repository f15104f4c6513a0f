"""Every renderer (HTML, Markdown, terminal, compare) over real, hostile and nearly empty results documents."""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import re

import pytest
from rich.console import Console

from tune_advisor import results
from tune_advisor.render import charts, html, markdown, terminal, view, write_compare, write_reports

from ..conftest import HOSTILE, ROOT, golden, hostile_document, minimal_documents, with_findings

def terminal_text(document: dict, verbose: bool = False) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    terminal.document_summary(document, console, verbose=verbose)
    return console.file.getvalue()


# --- real documents ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cnn", "io_bound"])
def test_html_report_of_a_real_run_has_every_section_and_the_verdict(name):
    doc = golden(name)
    page = html.render(doc)
    for section in ("verdict", "settings", "findings", "staircase", "probes", "charts", "environment", "budget",
                    "reproduce"):
        assert f'<section id="{section}"' in page, section
    assert "confirmed speedup" in page and f"{doc['speedup']['median']:.2f}x" in page
    assert page.count("<svg") >= 2 and "<img" not in page  # charts are inline SVG
    assert all(p["id"] in page for p in doc["probes"])
    assert "No findings" in page
    assert doc["command"][2] in page  # how to reproduce


def test_html_is_self_contained_with_a_policy_that_admits_only_its_own_script():
    page = html.render(golden())
    # no attribute points anywhere: no src/href to a URL, no CSS url() or @import
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page, re.I)
    assert "url(" not in page.replace("url(#", "") and "@import" not in page
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert "default-src 'none'" in csp and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    script = re.search(r"<script>(.*?)</script>", page, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp  # the hash matches the script as inlined, so the sort works
    assert page.count("<script") == 1


def test_rendering_twice_gives_the_same_bytes():
    assert html.render(golden()) == html.render(golden())


def test_markdown_report_has_verdict_settings_and_findings():
    text = markdown.render(with_findings())
    assert "2.29x" in text and "```python" in text and "batch_size=64" in text
    assert "### Findings (2)" in text and "TA401" in text and "measured 1.82x (95% CI 1.77–1.88)" in text
    assert "*estimated* 1.19x" in text  # an estimate is labelled so


def test_findings_are_rendered_with_evidence_fix_and_gain_in_their_order():
    page = html.render(with_findings())
    assert page.index("TA401") < page.index("TA301")
    assert "saves 45.0% of step time" in page and "estimated" in page
    assert "bf16_samples_per_s" in page and "torch.autocast(device_type=&#39;cpu&#39;" in page


def test_terminal_summary_of_a_document_lists_top_findings_and_failures():
    doc = with_findings()
    doc["probes"][5].update(status="oom", error="CPU allocator: out of memory")
    text = terminal_text(doc)
    assert "2.29x faster (95% CI 2.21–2.38)." in text.splitlines()[1] and "Apply it" in text
    assert "TA401 (measured 1.82x)" in text and "1 failed" in text
    verbose = terminal_text(doc, verbose=True)
    assert "Speedup      2.29x" in verbose and "Apply it" in verbose
    assert "TA401 fp32-on-bf16-capable-cpu" in verbose and "Failed probes" in verbose and "out of memory" in verbose


def test_every_renderer_gives_the_more_time_line_where_the_budget_cut_the_plan_and_only_there():
    # GIVEN a 3-minute run that left compile=default over budget
    cut, own = golden("io_bound_quickstart"), golden("cnn")
    said = "More time would have tried: compile=default. For the thorough plan, run:"
    command = "tune-advisor analyze fixtures/io_bound.py -o reports/io_bound --budget 10m --device auto --quiet"
    # THEN the terminal says it beside the verdict, in the summary and in --verbose
    short = terminal_text(cut).splitlines()
    assert short.index(f"  {said}") + 1 == short.index(f"    {command}") < short.index("Apply it")
    assert f"{said} {command}" in terminal_text(cut, verbose=True)
    # AND the Markdown after the verdict, the command as code; the HTML in the verdict section
    md = markdown.render(cut)
    assert f"{said} `{command}`" in md.split("### Apply it")[0]
    page = html.render(cut)
    assert f'<p id="more-time">{said} <code>{command}</code></p>' in page.split('<section id="settings"')[0]
    # AND a run whose plan ended on its own has none of it
    assert not any("thorough plan" in text for text in (terminal_text(own, verbose=True), markdown.render(own),
                                                         html.render(own)))


def test_a_run_through_the_python_api_is_told_the_budget_option_not_its_programs_command_line():
    # GIVEN the quick start's cut run as a benchmark ran it through api.analyze: its argv is the benchmark's
    cut = golden("io_bound_quickstart")
    cut["command"] = ["benchmarks/budget_curve.py", "io_bound.py", "--budgets", "1m,3m", "--out", "/tmp/bc"]
    # THEN the line says to run again with --budget 10m, not `budget_curve.py ... --budget 10m` (which takes none)
    said = "More time would have tried: compile=default. For the thorough plan, run again with `--budget 10m`"
    assert said in markdown.render(cut)
    assert "budget_curve.py" not in markdown.render(cut).split("### Apply it")[0]
    # AND `python -m tune_advisor` keeps its command, with the budget in place
    cut["command"] = ["/x/site-packages/tune_advisor/__main__.py", "analyze", "w.py", "--budget", "3m"]
    assert "run: `python -m tune_advisor analyze w.py --budget 10m`" in markdown.render(cut)


def test_write_reports_writes_both_files_atomically(tmp_path):
    paths = write_reports(golden(), tmp_path / "new" / "folder")
    assert [p.name for p in paths] == ["report.html", "report.md"] and all(p.stat().st_size > 1000 for p in paths)
    assert not list(paths[0].parent.glob("*.tmp"))


def test_compare_renders_both_runs_and_the_findings_diff(tmp_path):
    a, b = golden("cnn"), with_findings()
    b["findings"] = b["findings"][:1]
    page = html.render_compare(a, b, ("before.json", "after.json"))
    assert "before.json" in page and "after.json" in page and "TA401" in page and "only B" in page
    assert write_compare(a, golden("io_bound"), tmp_path).name == "compare.html"


# --- hostile text ------------------------------------------------------------------------------------------------


def test_hostile_text_is_escaped_in_html():
    page = html.render(hostile_document())
    assert "<img src=x" not in page and "</script><img" not in page
    assert page.count("<script") == 1 and page.count("</script>") == 1
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "{{ 7*7 }}" in page and ">49<" not in page  # values are data, never template code
    compare = html.render_compare(hostile_document(), golden(), (HOSTILE, "b.json"))
    assert "<img src=x" not in compare and "&lt;img src=x" in compare


def gfm_to_html(text: str) -> str:
    """Markdown as GitHub parses it, raw HTML passed through (markdown-it-py comes with rich)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(text)


def test_hostile_text_is_escaped_in_markdown():
    text = markdown.render(hostile_document())
    rendered = gfm_to_html(text)
    # WHEN GitHub turns the Markdown into HTML THEN no tag of the hostile text is live
    assert "<img" not in rendered and "</script>" not in rendered and "<strong>y</strong>" not in rendered
    assert "&lt;img src=x onerror=alert(1)&gt;" in rendered
    # AND a '|' in a value adds no table cell
    for row in re.findall(r"<tr>(.*?)</tr>", rendered, re.S):
        assert len(re.findall(r"<t[hd]>", row)) == 3


def test_hostile_text_reaches_the_terminal_literally():
    text = terminal_text(hostile_document())
    assert "<img src=x onerror=alert(1)> [/] [bold red]x" in text  # rich markup in values is shown, not applied


# --- (almost) nothing to show ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["started", "baseline_failed", "baseline_stopped", "bare"])
def test_every_renderer_survives_a_run_with_nothing_measured(kind):
    doc = minimal_documents()[kind]
    page, text, term = html.render(doc), markdown.render(doc), terminal_text(doc)
    # (a baseline the budget cut short did not fail: the verdict says it did not finish, and how to get one)
    expected = {"baseline_failed": "The baseline probe failed (error): RuntimeError: boom",
                "baseline_stopped": "The baseline probe did not finish (stopped: the analysis budget (--budget) ran "
                                    "out 1.3 s into it). Nothing can be compared with it; run again with a longer "
                                    "--budget."}.get(kind, "No baseline")
    for output in (page, text, term):
        assert expected in " ".join(output.replace("\\_", "_").split()), output[:400]
    assert "No findings" in page and "No findings" in text
    assert "No staircase" in page
    html.render_compare(doc, golden(), ("a", "b"))
    terminal.comparison_summary(view.compare(doc, doc), Console(file=io.StringIO()))


def test_a_document_that_round_trips_through_json_renders_the_same():
    doc = with_findings()
    assert html.render(json.loads(json.dumps(doc))) == html.render(doc)


def test_charts_mark_the_oom_frontier_and_draw_gpu_data_when_present():
    # GIVEN a run whose batch ladder ran out of memory at 128, with NVML samples on one probe
    doc = golden("cnn")
    oom = copy.deepcopy(doc["probes"][6])
    oom.update(id="p020", status="oom", error="CPU allocator: out of memory",
               settings={**oom["settings"], "batch_size": 128})
    doc["probes"].append(oom)
    doc["probes"][0]["gpu"] = {"util_mean": 87.0, "timeline": {"t_s": [0.0, 0.5, 1.0], "util": [80, None, 91],
                                                               "power_w": [200.0, 250.0, 251.0]}}
    report = view.build(doc)
    made = {c.id: c for c in charts.charts(report)}
    # THEN the batch chart marks the frontier, the GPU timeline is drawn and the probe table shows GPU util
    assert "OOM from batch 128" in made["chart-batch"].svg and "128" in made["chart-batch"].caption
    assert "chart-timeline" in made and "power_w" in made["chart-timeline"].svg
    page = html.render(doc)
    assert "GPU util" in page and "87%" in page and "No GPU timeline" not in page


def test_probes_stopped_by_the_budget_or_a_partner_and_unsupported_ones_are_not_failures(tmp_path):
    # GIVEN a run with a probe the budget cut short, a recheck whose lockstep partner failed, a paired figure,
    # and a bf16 probe that hit an operator without a bf16 kernel on this CPU
    doc = golden("cnn")
    first, second = copy.deepcopy(doc["probes"][0]), copy.deepcopy(doc["probes"][0])
    budget = {**first, "id": "p090", "status": "stopped", "settings": {**first["settings"], "batch_size": 512},
              "error": "stopped: the analysis budget (--budget) ran out 3.2 s into it; killed the probe's group",
              "extra": {"budget_stopped": True}}
    partner = {**second, "id": "p091", "status": "stopped", "role": "recheck",
               "error": "stopped: its lockstep partner p092 ended (oom) after 0 measured steps of this side"}
    paired = {**copy.deepcopy(first), "id": "p093", "extra": {"lockstep": {"partner": "p094"}}}
    unsupported = {**copy.deepcopy(first), "id": "p095", "status": "unsupported",
                   "settings": {**first["settings"], "amp": "bf16"},
                   "error": "amp=bf16: the LSTM has no bf16 kernel on this CPU (oneDNN)"}
    doc["probes"] += [budget, partner, paired, unsupported]
    path = tmp_path / "results.json"
    results.write_atomic(path, doc)
    doc = results.read(path)  # the schema admits both statuses
    # THEN no renderer lists them among failed probes, and each names them under its own heading
    r = view.build(doc)
    assert not {"p090", "p091", "p095"} & {row.id for row in r.failed}
    assert [row.id for row in r.stopped] == ["p090", "p091"] and [row.id for row in r.unsupported] == ["p095"]
    md = markdown.render(doc)
    failed_md = md.split("### Failed probes")[1].split("###")[0] if "### Failed probes" in md else ""
    assert "p090" not in failed_md and "budget (--budget) ran out" in md.split("### Stopped before a whole window")[1]
    assert "no bf16 kernel" in md.split("### Unsupported on this machine")[1]
    assert "failed" not in terminal_text(doc) and "2 stopped, 1 unsupported" in terminal_text(doc)
    text = terminal_text(doc, verbose=True)
    assert "budget (--budget) ran out" in text.split("Stopped before a whole window")[1]
    assert "p090" not in text.split("Stopped before a whole window")[0]
    page = html.render(doc)
    assert re.search(r"Stopped before a whole window.*p090.*ran out.*p091.*partner p092", page, re.S)
    assert re.search(r"Unsupported on this machine.*p095", page, re.S)
    # AND a paired figure says whose partner it was
    assert "beside p094" in page


def test_the_verdict_figures_say_what_kind_of_interval_they_are():
    # GIVEN an older file (no `figures`): each side's throughput is its probe's window, labelled so
    doc = golden("cnn")
    page = html.render(doc)
    assert f"95% CI within one measured window ({doc['baseline']['id']})" in page
    # GIVEN figures over several runs: the reports print those, with their kind, everywhere
    doc["figures"] = {side: {"median": 1234.5, "ci_low": 1100.0, "ci_high": 1380.0, "unit": "samples/s",
                             "interval": f"95% prediction interval of one more run, over 3 runs ({side})",
                             "runs": ["p001", "p007", "p009"]} for side in ("baseline", "recommended")}
    page, md, text = html.render(doc), markdown.render(doc), terminal_text(doc, verbose=True)
    how = page.split('id="how-measured"')[1].split("</details>")[0]
    for side in ("baseline", "recommended"):
        label = f"95% prediction interval of one more run, over 3 runs ({side})"
        # behind "how this was measured": the HTML's details, Markdown's footnote, the terminal's --verbose
        assert label in how and label in md.split("[^how]: ")[1] and label in text
        assert label not in terminal_text(doc)
    assert "1,234" in page or "1234" in page
    # AND the range is given with the figure's own kind, never called a "95% CI" beside it
    assert "1,234 [1,100, 1,380] samples/s: 95% prediction interval of one more run" in how
    assert "95% CI 1,100–1,380" not in page


def test_a_ddp_probe_shows_each_ranks_own_gpu_utilisation():
    # GIVEN a DDP probe whose two ranks each sampled their own GPU (distributed/merge.py keeps them in gpu.ranks)
    doc = golden("cnn")
    doc["probes"][0]["gpu"] = {"util_mean": 91.0, "ranks": [{"util_mean": 91.0}, {"util_mean": 47.0}]}
    row = next(r for r in view.build(doc).rows if r.id == doc["probes"][0]["id"])
    # THEN the view carries both ranks, in rank order, and the probe table prints them beside the mean
    assert row.gpu_util_ranks == [0.91, 0.47]
    assert "per rank: r0 91% · r1 47%" in html.render(doc)
    # AND a probe on one GPU (one rank, or no rank list) gets no per-rank line
    doc["probes"][0]["gpu"] = {"util_mean": 91.0, "ranks": [{"util_mean": 91.0}]}
    assert "per rank" not in html.render(doc)


# --- the terminal fits a screen ---------------------------------------------------------------------------------

COMMITTED = sorted([*ROOT.glob("reports/*/results.json"), *ROOT.glob("reports/gpu/*/results.json"),
                    *ROOT.glob("tests/golden/*.results.json")])


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_default_summary_fits_a_screen_and_verbose_keeps_every_probe_and_derivation(path):
    doc = json.loads(path.read_text())
    lines = terminal.render(doc).splitlines()
    assert len(lines) <= 25 and max(map(len, lines)) <= 160, "\n".join(lines)
    verbose = terminal.render(doc, verbose=True)
    assert all(f"  {p['id']} " in verbose for p in doc["probes"])
    r = view.build(doc)
    derivations = [r.figures[side]["interval"] for side in ("baseline", "recommended") if r.figures[side]["median"]]
    derivations += [(doc.get("speedup") or {}).get("method"), *(f.basis for f in r.findings),
                    *(s.how for s in r.staircase)]
    assert [d for d in derivations if d and d not in verbose] == []
