"""Renderers: each turns a results.json document into one output (HTML, Markdown, terminal) and does nothing else.

Each renderer module (`html`, `markdown`, `terminal`) is a `Renderer`: `render(document) -> str` and the
`output_file_extension` of what it renders. `write_reports(document, out_dir)` writes report.html and report.md;
`tune-advisor report` and the end of an analysis call it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol, runtime_checkable

from ..files import write_text_atomic

__all__ = ["Renderer", "write_reports", "write_compare"]


@runtime_checkable
class Renderer(Protocol):
    """What each renderer module (html, markdown, terminal) is: a module satisfies it by its two names."""

    output_file_extension: str

    def render(self, document: Mapping[str, Any]) -> str:
        """The whole output for one results.json document."""
        ...


def write_reports(document: Mapping[str, Any], out_dir: Path, cost_per_hour: float | None = None) -> list[Path]:
    """Render report.html and report.md from a results.json document into `out_dir`; return their paths.
    `cost_per_hour`: what an hour of the machine costs (the reports then show an epoch's cost)."""
    from . import html, markdown  # matplotlib and jinja2 load only when a report is written

    renderers: tuple[Renderer, ...] = (html, markdown)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [write_text_atomic(out_dir / f"report.{module.output_file_extension}",
                              module.render(document, cost_per_hour=cost_per_hour))
            for module in renderers]


def write_compare(doc_a: Mapping[str, Any], doc_b: Mapping[str, Any], out_dir: Path,
                  names: tuple[str, str] = ("A", "B")) -> Path:
    """Render compare.html for two results.json documents into `out_dir`."""
    from . import html

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(out_dir / "compare.html", html.render_compare(doc_a, doc_b, names))
