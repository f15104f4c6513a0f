"""The HTML reports in a real headless Chromium: offline, no errors, every section, a working sort, no injection.

Playwright drives the system's Chromium (Debian package `chromium`); screenshots go to test-artifacts/.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tune_advisor.render import html, write_compare, write_reports

from ..conftest import HOSTILE, ROOT, golden, hostile_document, minimal_documents, with_findings

CHROMIUM = os.environ.get("TUNE_ADVISOR_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = ROOT / "test-artifacts"
SECTIONS = [section for section, _ in html.REPORT_SECTIONS]



@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright  # a dev dependency: missing it is a setup error, not a skip

    if CHROMIUM is None:  # the README's test command installs it: a missing one is a setup error, not a skip
        pytest.fail("no Chromium on PATH: install it with `apt-get install -y chromium` (see .ci/run)")

    with sync_playwright() as p:
        # The system Chromium, not Playwright's own download (which may not be reachable from CI).
        browser = p.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


class Visit:
    """One page load with everything it did recorded: requests, console errors, page errors, dialogs."""

    def __init__(self, browser, path: Path, color_scheme: str = "light"):
        self.page = browser.new_page(viewport={"width": 1200, "height": 900}, color_scheme=color_scheme)
        self.url = path.resolve().as_uri()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(self.url, wait_until="load")

    def assert_clean(self):
        assert self.errors == [], self.errors
        assert self.requests == [self.url], self.requests  # the file itself, nothing else
        assert self.dialogs == []

    def screenshot(self, name: str):
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)

    def close(self):
        self.page.close()


def example_reports(tmp_path_factory) -> list[tuple[str, Path]]:
    out = tmp_path_factory.mktemp("reports")
    made = []
    for name, doc in (("cnn", golden("cnn")), ("io_bound", golden("io_bound")), ("findings", with_findings())):
        write_reports(doc, out / name)
        made.append((name, out / name / "report.html"))
    committed = sorted((ROOT / "reports").glob("*/report.html"))
    return made + [(f"committed-{p.parent.name}", p) for p in committed]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return example_reports(tmp_path_factory)


def probe_order(page) -> list[str]:
    return page.locator("#probe-table tbody tr td:first-child").all_inner_texts()


def test_every_example_report_loads_offline_with_every_section_and_sorts(browser, reports):
    for name, path in reports:
        visit = Visit(browser, path)
        page = visit.page
        try:
            visit.assert_clean()
            for section in SECTIONS:
                heading = page.locator(f"section#{section} h2")
                assert heading.count() == 1 and heading.is_visible(), (name, section)
            assert page.locator("#verdict .verdict").inner_text().strip(), name
            # the step breakdown always; each change's share where there is more than one row to draw (a single
            # change's bar would be the confirmed one again); batch size vs throughput when batches varied
            assert page.locator("#charts svg").count() >= 1, name
            stairs = page.locator("#staircase tbody tr").count()
            assert page.locator("#chart-waterfall svg").count() == (1 if stairs >= 3 else 0), (name, stairs)
            # WHEN the folded probe list is opened and the throughput header clicked THEN rows are in ascending
            # throughput, failures last
            page.locator("#probe-list summary").click()
            before = probe_order(page)
            page.get_by_role("button", name="throughput [95% CI]").click()
            ascending = probe_order(page)
            values = [float(v) for v in page.locator("#probe-table tbody tr td:nth-child(5)").evaluate_all(
                "cells => cells.map(c => c.dataset.sort)") if v]
            assert values == sorted(values) and len(values) >= 3, name
            assert ascending != before and sorted(ascending) == sorted(before)
            # AND a second click reverses it
            page.get_by_role("button", name="throughput [95% CI]").click()
            assert probe_order(page)[:len(values)] == ascending[:len(values)][::-1]
            page.get_by_role("button", name="id").click()
            assert probe_order(page) == sorted(before)
            visit.assert_clean()
            visit.screenshot(f"report-{name}")
        finally:
            visit.close()


def test_the_report_follows_a_dark_system_theme(browser, reports):
    name, path = reports[0]
    visit = Visit(browser, path, color_scheme="dark")
    try:
        visit.assert_clean()
        background = visit.page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(13, 17, 23)", background
        visit.screenshot(f"report-{name}-dark")
    finally:
        visit.close()


def test_hostile_strings_stay_text_in_the_browser(browser, tmp_path):
    write_reports(hostile_document(), tmp_path)
    compare = write_compare(hostile_document(), golden(), tmp_path, (HOSTILE, "b.json"))
    for path in (tmp_path / "report.html", compare):
        visit = Visit(browser, path)
        page = visit.page
        try:
            visit.assert_clean()  # no dialog from alert(1), no request for "x"
            assert page.locator("img").count() == 0 and page.locator("img[src=x]").count() == 0
            assert page.locator("script").count() == 1
            assert "<img src=x onerror=alert(1)>" in page.locator("header").inner_text()  # shown as text
            if path.name == "report.html":  # a setting the budget cut, named in the verdict's more-time line
                line = page.locator("#verdict #more-time")
                assert line.is_visible() and HOSTILE in line.inner_text()
                assert line.locator("code").inner_text().endswith(".py' --budget 10m")
            visit.screenshot(f"hostile-{path.stem}")
        finally:
            visit.close()


@pytest.mark.parametrize("kind, verdict", [("baseline_failed", "The baseline probe failed (error)"),
                                           ("baseline_stopped", "The baseline probe did not finish (stopped: the "
                                                                "analysis budget (--budget) ran out")])
def test_a_run_with_nothing_measured_renders_and_says_so(browser, tmp_path, kind, verdict):
    write_reports(minimal_documents()[kind], tmp_path)
    visit = Visit(browser, tmp_path / "report.html")
    try:
        visit.assert_clean()
        assert verdict in visit.page.locator("#verdict").inner_text()
        assert "No findings" in visit.page.locator("#findings").inner_text()
        visit.screenshot(f"report-{kind.replace('_', '-')}")
    finally:
        visit.close()


def test_a_winner_the_confirmation_could_not_tell_reads_in_the_verdict_with_the_thorough_plans_command(browser,
                                                                                                    tmp_path):
    # GIVEN the cnn run as a one-minute run whose confirmation read its winner within the noise, the budget ending
    # its rounds: the baseline kept, the figure in `unconfirmed`, the cut in the budget's unexplored list
    doc = golden("cnn")
    winner, changes = doc["recommended"], {k: v for k, v in doc["recommended"]["settings"].items()
                                           if doc["baseline"]["settings"][k] != v}
    measured = {**doc["speedup"], "median": 1.14, "ci_low": 0.94, "ci_high": 1.38, "later": None}
    doc.update(recommended=doc["baseline"], speedup=None, findings=[],
               unconfirmed={"probe": winner["id"], "changes": changes, "speedup": measured, "budget_short": True})
    doc.setdefault("plan", {})["ablation"] = []
    described = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items())
    doc["budget"].update(limit_s=60.0, unexplored=[f"{described}: its confirmation's further rounds over budget"])
    doc["command"] = ["tune-advisor", "analyze", "fixtures/cnn.py", "--budget", "1m"]
    write_reports(doc, tmp_path)
    visit = Visit(browser, tmp_path / "report.html")
    try:
        visit.assert_clean()
        # THEN the verdict keeps the settings, names the winner with its measured figure, and says more time would
        # tell; the thorough plan's command follows
        verdict = visit.page.locator("#verdict").inner_text()
        assert f"Keep your settings for now: {described} measured 1.14x (95% CI 0.94–1.38)" in verdict
        assert "a longer --budget would measure more rounds" in verdict
        page = visit.page.locator("body").inner_text()
        assert "tune-advisor analyze fixtures/cnn.py --budget 10m" in page
        visit.screenshot("report-unconfirmed")
    finally:
        visit.close()


def test_compare_page_loads_offline(browser, tmp_path):
    path = write_compare(golden("cnn"), golden("io_bound"), tmp_path, ("cnn.json", "io_bound.json"))
    visit = Visit(browser, path)
    try:
        visit.assert_clean()
        assert visit.page.locator("section#summary table tbody tr").count() >= 10
        visit.screenshot("compare")
    finally:
        visit.close()


FIRST_SCREEN = {"width": 1280, "height": 800}


def in_first_screen(page, selector: str) -> bool:
    """Whether the element is visible and wholly inside the first screen (no scrolling, down or sideways)."""
    box = page.locator(selector).first.bounding_box()
    return (page.locator(selector).first.is_visible() and box is not None and box["y"] >= 0 and box["x"] >= 0
            and box["y"] + box["height"] <= FIRST_SCREEN["height"] and box["x"] + box["width"] <= FIRST_SCREEN["width"])


@pytest.mark.parametrize("name", ["cnn", "hf_trainer"])
def test_the_first_screen_answers_and_the_method_is_one_click_away(browser, name):
    # GIVEN a committed report opened at 1280x800
    path = ROOT / "reports" / name / "report.html"
    page = browser.new_page(viewport=FIRST_SCREEN)
    try:
        page.goto(path.resolve().as_uri(), wait_until="load")
        # THEN the verdict sentence, the confirmed speedup with its CI and the "Apply it" code show without scrolling
        headline = page.locator("#headline").inner_text()
        assert headline.startswith("Change ") and "x faster (95% CI " in headline
        assert in_first_screen(page, "#headline") and in_first_screen(page, "#speedup-ci")
        assert page.locator("#speedup-ci").inner_text().startswith("95% CI ")
        assert in_first_screen(page, "#apply-it")
        # AND nothing is wider than the screen
        assert page.evaluate("document.documentElement.scrollWidth") <= FIRST_SCREEN["width"]
        # AND the derivation of the figures is hidden until "How this was measured" is opened
        derivation = page.locator("#how-measured li").first
        assert not derivation.is_visible()
        page.locator("#how-measured summary").click()
        assert derivation.is_visible() and "interval" in page.locator("#how-measured").inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=ARTIFACTS / f"first-screen-{name}.png")
    finally:
        page.close()
