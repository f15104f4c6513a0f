"""The README stays a front door and the docs stay readable: sizes, links that resolve, the README's picture."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..conftest import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.md"))  # the measurement logs the docs link to
README_MAX = 12 * 1024  # bytes: what it is, the picture, two commands, the contract, the ways in, the CLI, links
DOC_MAX = 40 * 1024  # bytes per docs page: design text; measurement logs live in benchmarks/results/

# [text](target) and ![alt](target); a target may carry a "title" after a space
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def relative_links(page: Path) -> list[str]:
    """The targets of the page's Markdown links that point into the repository (no URL, no bare #anchor)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    targets = [t.split("#", 1)[0] for t in LINK.findall(text)]
    return [t for t in targets if t and not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_readme_is_at_most_12_kb():
    assert README.stat().st_size <= README_MAX, f"README.md is {README.stat().st_size} bytes (at most {README_MAX})"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_docs_page_is_at_most_40_kb(page):
    assert page.stat().st_size <= DOC_MAX, f"{page.name} is {page.stat().st_size} bytes (at most {DOC_MAX})"


@pytest.mark.parametrize("page", [README, *DOCS, *RESULTS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_in_the_repository(page):
    # GIVEN every relative link of the page
    # THEN each names a file or folder that exists, relative to the page
    missing = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert missing == [], f"{page.relative_to(ROOT)} links to missing paths: {missing}"


def test_the_readme_shows_the_committed_report_screenshot():
    # GIVEN the README's images
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", README.read_text())
    # THEN it shows the first screen of a report, and that PNG exists (reports/screenshot.py writes it)
    assert "docs/img/report.png" in images
    png = ROOT / "docs" / "img" / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_link_finder_sees_relative_links_and_skips_urls_anchors_and_code(tmp_path):
    # GIVEN a page with each kind of link, and one inside a code block
    page = tmp_path / "links.md"
    page.write_text("[a](docs/x.md#part) ![b](img/y.png) [c](https://e.org) [d](#top)\n```\n[e](nowhere.md)\n```\n")
    # THEN only the relative targets count, without their anchors
    assert relative_links(page) == ["docs/x.md", "img/y.png"]
