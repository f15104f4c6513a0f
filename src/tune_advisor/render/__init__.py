"""Renderers: each turns a results.json document into one output (HTML, Markdown, terminal) and does nothing else.

`write_reports(document, out_dir)` writes report.html and report.md; `tune-advisor report` and the end of an
analysis call it. `from tune_advisor.render import html, markdown` gives `html.render(document) -> str` and
`markdown.render(document) -> str`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

__all__ = ["write_reports", "write_compare", "write_text"]


def write_text(path: Path, text: str) -> Path:
    """Write via a temporary file in the same folder and rename: a reader never sees half a report."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_reports(document: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Render report.html and report.md from a results.json document into `out_dir`; return their paths."""
    from . import html, markdown  # matplotlib and jinja2 load only when a report is written

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_text(out_dir / f"report.{module.output_file_extension}", module.render(document))
            for module in (html, markdown)]


def write_compare(doc_a: Mapping[str, Any], doc_b: Mapping[str, Any], out_dir: Path,
                  names: tuple[str, str] = ("A", "B")) -> Path:
    """Render compare.html for two results.json documents into `out_dir`."""
    from . import html

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_text(out_dir / "compare.html", html.render_compare(doc_a, doc_b, names))
