"""Re-render report.html, report.md and the terminal summary from a saved results.json (no torch, no GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import results
from ..errors import UsageError
from ..render import write_reports
from ..render.terminal import document_summary
from ._common import handle_errors, out as stdout


@handle_errors
def command(
    results_file: Path = typer.Argument(..., help="A results.json written by `tune-advisor analyze`."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Folder for report.html and report.md [default: the results file's folder]."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors."),
) -> None:
    """Re-render report.html, report.md and the terminal summary from a saved results.json (no torch, no GPU)."""
    document = results.read(results_file)
    folder = out if out is not None else results_file.parent
    try:
        written = write_reports(document, folder)
    except OSError as exc:
        raise UsageError(f"{folder}: cannot write the reports there ({exc.strerror or exc})") from None
    if not quiet:
        document_summary(document, stdout, results_path=results_file)
        for path in written:
            stdout.print(f"wrote {path}", highlight=False, markup=False)
