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
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print every probe and every figure's derivation."),
    cost_per_hour: Optional[float] = typer.Option(None, help="What an hour of the machine costs (e.g. 2.50): the "
                                                             "reports show the cost of an epoch before and after."),
) -> None:
    """Re-render report.html, report.md and the terminal summary from a saved results.json (no torch, no GPU)."""
    if cost_per_hour is not None and not cost_per_hour > 0:
        raise UsageError(f"--cost-per-hour {cost_per_hour}: expected what an hour of the machine costs, above 0")
    document = results.read(results_file)
    folder = out if out is not None else results_file.parent
    try:
        written = write_reports(document, folder, cost_per_hour)
    except OSError as exc:
        raise UsageError(f"{folder}: cannot write the reports there ({exc.strerror or exc})") from None
    if not quiet:
        document_summary(document, stdout, results_path=results_file, verbose=verbose, cost_per_hour=cost_per_hour)
        for path in written:
            stdout.print(f"wrote {path}", highlight=False, markup=False)
