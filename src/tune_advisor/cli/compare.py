"""Show two runs side by side: settings, throughput, speedup, memory and findings."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import results
from ..errors import UsageError
from ..render import view, write_compare
from ..render.terminal import comparison_summary
from ._common import handle_errors, out as stdout


@handle_errors
def command(
    a: Path = typer.Argument(..., help="The first results.json (A)."),
    b: Path = typer.Argument(..., help="The second results.json (B)."),
    out: Path = typer.Option(Path("tune-advisor-report/compare"), "--out", "-o", help="Folder for compare.html."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors."),
) -> None:
    """Show two runs side by side: settings, throughput, speedup, memory and findings."""
    doc_a, doc_b = results.read(a), results.read(b)
    names = (str(a), str(b))
    try:
        path = write_compare(doc_a, doc_b, out, names)
    except OSError as exc:
        raise UsageError(f"{out}: cannot write compare.html there ({exc.strerror or exc})") from None
    if not quiet:
        comparison_summary(view.compare(doc_a, doc_b, names), stdout)
        stdout.print(f"wrote {path}", highlight=False, markup=False)
