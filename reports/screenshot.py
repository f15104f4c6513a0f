"""The README's picture: the first screen of a committed report, taken in headless Chromium.

    python reports/screenshot.py                                  # reports/cnn/report.html -> docs/img/report.png
    python reports/screenshot.py reports/io_bound/report.html -o /tmp/io_bound.png

Playwright drives the system's Chromium (Debian package `chromium`), as the browser tests do, so the picture is
regenerated from the report itself rather than edited by hand. Only the first screen (the viewport) is taken:
what a reader sees on opening the report.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "reports" / "cnn" / "report.html"
IMAGE = ROOT / "docs" / "img" / "report.png"
VIEWPORT = {"width": 1280, "height": 800}


def chromium() -> str:
    """The system Chromium's path; exits with a message where there is none."""
    found = os.environ.get("TUNE_ADVISOR_CHROMIUM") or shutil.which("chromium")
    if found is None:
        sys.exit("no Chromium on PATH: install it with `apt-get install -y chromium`")
    return found


def screenshot(report: Path, image: Path) -> None:
    """Open `report` offline at VIEWPORT and write its first screen to `image` (PNG)."""
    from playwright.sync_api import sync_playwright  # a dev dependency

    image.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium())
        try:
            page = browser.new_page(viewport=VIEWPORT, color_scheme="light")
            page.goto(report.resolve().as_uri(), wait_until="load")
            page.screenshot(path=image, full_page=False)
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", type=Path, default=REPORT, help="a report.html (default: %(default)s)")
    parser.add_argument("-o", "--out", type=Path, default=IMAGE, help="the PNG to write (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.report.is_file():
        sys.exit(f"{args.report}: no such report")
    screenshot(args.report, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
