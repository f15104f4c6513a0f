"""Terminal output with rich: one probe's numbers, a line per finished probe, and the analysis summary.

`render(document)` is the summary as plain text (the `Renderer` protocol); the CLI prints with the functions
below, in colour, to its console.
"""

from __future__ import annotations

import io
import textwrap
from typing import Any, Mapping

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import knobs
from ..fmt import fmt_bytes, fmt_ci, fmt_later, fmt_speedup
from ..probe.result import ProbeResult
from . import view

output_file_extension = "txt"


def fmt_throughput(result: ProbeResult) -> str:
    if not result.ok or not result.step_s:
        return "-"
    median, low, high = result.throughput()
    return fmt_ci({"median": median, "ci_low": low, "ci_high": high, "unit": result.unit})


def probe_line(result: ProbeResult, baseline: dict[str, Any] | None) -> str:
    """One line per finished probe while an analysis runs."""
    changed = knobs.describe(result.settings, baseline) if baseline else knobs.describe(result.settings)
    status = result.status.value
    detail = fmt_throughput(result) if result.ok else (result.error or "")
    return f"{result.id}  {result.role:<22} {changed:<40} {status:<8} {detail}  ({result.wall_s:.1f} s)"


def probe_table(result: ProbeResult, console: Console) -> None:
    """The full numbers of one probe (`tune-advisor probe`)."""
    d = result.to_dict()
    table = Table(title=f"probe: {knobs.brief(result.settings)}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("status", d["status"] + (f" — {d['error']}" if d["error"] else ""))
    if result.step_s:
        st = d["step_time_s"]
        table.add_row("throughput", fmt_throughput(result))
        table.add_row("step time", f"median {st['median'] * 1e3:.2f} ms, IQR {st['iqr'] * 1e3:.2f} ms "
                                   f"over {len(result.step_s)} measured steps")
        table.add_row("data wait", f"{d['data_wait_frac'] * 100:.1f}% of step time")
        h2d = result.raw.get("h2d_s") or []
        if h2d:
            table.add_row("host→device", f"{sum(h2d) / sum(result.step_s) * 100:.1f}% of step time")
        table.add_row("loss", f"first {d['loss']['first']}, last {d['loss']['last']}, "
                              f"finite {d['loss']['finite']}")
    table.add_row("peak memory", fmt_bytes(d["peak_memory_bytes"]))
    extra = result.extra
    if "warmup_s" in extra:
        table.add_row("warm-up", f"{extra['warmup_s']:.2f} s (excluded)")
    if extra.get("cpu_util") is not None:
        table.add_row("CPU utilisation", f"{extra['cpu_util'] * 100:.0f}% of all cores")
    table.add_row("wall", f"{result.wall_s:.1f} s")
    console.print(table)


WIDTH = 160  # no line of the default summary is wider
TOP_FINDINGS = 3


def render(document: Mapping[str, Any], verbose: bool = False, cost_per_hour: float | None = None) -> str:
    """The summary `tune-advisor report` prints for `document`, as plain text: no colour, lines not wrapped."""
    console = Console(file=io.StringIO(), color_system=None, soft_wrap=True)
    document_summary(document, console, verbose=verbose, cost_per_hour=cost_per_hour)
    return console.file.getvalue()


def analysis_summary(result, console: Console, verbose: bool = False, cost_per_hour: float | None = None) -> None:
    """The answer first, in a screen (`tune-advisor analyze`); `verbose`: every figure's derivation too."""
    document_summary(result.document, console, results_path=result.results_path, verbose=verbose,
                     cost_per_hour=cost_per_hour)


def document_summary(document: Mapping[str, Any], console: Console, results_path=None, verbose: bool = False,
                     cost_per_hour: float | None = None) -> None:
    """The terminal summary of a results.json document. By default it fits a screen (at most 25 lines, none over
    WIDTH): the verdict in a sentence, what it means for an epoch, the code to apply, each kept change's share, the
    top findings, and counts of the rest. `verbose`: every probe and every figure's derivation as well."""
    r = view.build(document, cost_per_hour=cost_per_hour)
    if verbose:
        _verbose_summary(r, console, results_path)
    else:
        _short_summary(r, console, results_path)


def _line(console: Console, text: str, style: str = "", cut: bool = False) -> None:
    """A line of the short summary: wrapped at WIDTH, or with `cut` shortened to WIDTH (a finding: the rest is in
    report.html and --verbose)."""
    if cut and len(text) > WIDTH:
        text = text[:WIDTH - 1] + "…"
    for part in textwrap.wrap(text, WIDTH, subsequent_indent="    ", break_on_hyphens=False) or [""]:
        console.print(f"[{style}]{escape(part)}[/]" if style else escape(part), highlight=False)


def _short_summary(r: "view.Report", console: Console, results_path) -> None:
    _line(console, r.title, "bold")
    if not r.headline:
        _line(console, r.verdict, "bold" if r.baseline_ok else "bold red")
    else:
        _line(console, r.headline, "bold green")
        if r.epoch:
            _line(console, "  " + " · ".join(f"{what}: {value}" for what, value in r.epoch))
        if r.caveat:
            _line(console, f"  note: {r.caveat}", "yellow")
    if r.more_time:  # the command on a line of its own, to copy
        _line(console, "  " + r.more_time.lead)
        _line(console, "    " + r.more_time.command)
    if r.snippet:
        console.print("[bold]Apply it[/]")
        for code_line in r.snippet.splitlines():  # code as written: never wrapped
            console.print("    " + code_line, markup=False, highlight=False)
    if r.run_command:
        _line(console, "  or run: " + r.run_command)
    if sum(s.kind != "total" for s in r.staircase) > 1:
        _line(console, "Each change: " + " · ".join(
            f"{s.label.removeprefix('+ ')} {s.figure['median']:.2f}x" for s in r.staircase if s.kind != "total")
            + f" = {r.staircase[-1].cumulative:.2f}x")
    gains = [f for f in r.findings if fmt_speedup(f.speedup) != "-"]
    if r.findings:
        _line(console, f"Findings ({len(r.findings)}):", "bold")
        for f in (gains or r.findings)[:TOP_FINDINGS]:
            gain = f" ({'measured' if f.measured else 'estimated'} {fmt_speedup(f.speedup).split(' ')[0]})" \
                if f in gains else ""
            _line(console, f"  {f.code}{gain}: {f.message}", cut=True)
    folded = [f"{len(rows)} {what}" for what, rows in (("failed", r.failed), ("stopped", r.stopped),
                                                       ("unsupported", r.unsupported), ("not applicable", r.skipped))
              if rows] + ([f"{len(r.unexplored)} unexplored"] if r.unexplored else [])
    if folded:
        _line(console, "Probes: " + ", ".join(folded) + " (report.html, or --verbose)")
    if results_path is not None:
        _line(console, f"results: {results_path}")


def _verbose_summary(r: "view.Report", console: Console, results_path=None) -> None:
    """Everything the short summary leaves out: each figure's derivation, every probe, every finding."""
    base, rec = r.baseline, r.recommended
    console.print()
    console.print(f"[bold]{escape(r.title)}[/]", highlight=False)
    if not r.baseline_ok:
        console.print(f"[bold red]{escape(r.verdict)}[/]", highlight=False)
    else:
        console.print(f"[bold]Baseline[/]     {escape(knobs.brief(base.settings))}", highlight=False)
        console.print(f"               {escape(fmt_ci(r.figures['baseline']))} "
                      f"({escape(r.figures['baseline']['interval'])}), "
                      f"peak memory {fmt_bytes(base.peak_memory_bytes)}", highlight=False)
        if r.changes:
            console.print(f"[bold green]Recommended[/]  {escape(knobs.describe(r.changes))}", highlight=False)
            console.print(f"               {escape(fmt_ci(r.figures['recommended']))} "
                          f"({escape(r.figures['recommended']['interval'])}), "
                          f"peak memory {fmt_bytes(rec.peak_memory_bytes)}", highlight=False)
        else:
            console.print(f"[bold]Recommended[/]  {escape(r.verdict)}", highlight=False)
        if r.speedup and r.speedup.get("median") is not None:
            method = f"; {r.speedup['method']}" if r.speedup.get("method") else ""
            later = f"; {fmt_later(r.speedup)}" if fmt_later(r.speedup) else ""
            console.print(f"[bold]Speedup[/]      {fmt_speedup(r.speedup)}{later}{escape(str(method))}",
                          highlight=False)
        if r.batch_note:
            console.print(f"               note: {escape(r.batch_note)}", highlight=False)
        if r.snippet:
            console.print("\n[bold]Apply it[/]")
            console.print(textwrap.indent(r.snippet, "    "), markup=False, highlight=False)
        if r.run_command:
            console.print("[bold]Or run[/] (the script's own flags)")
            console.print(textwrap.indent(r.run_command, "    "), markup=False, highlight=False)
            if r.run_command_rest:
                console.print(f"    and {escape(r.run_command_rest)}", highlight=False)
    if r.staircase:
        console.print("\n[bold]Each change's own measured share[/] (the product of the rows is the confirmed speedup)")
        for s in r.staircase:
            console.print(f"  {escape(s.label)}: {escape(fmt_speedup(s.figure))} — {escape(s.how)}", highlight=False)
    if r.epoch:
        console.print("\n" + escape(" · ".join(f"{what}: {value}" for what, value in r.epoch)), highlight=False)
    for side, mfu in r.mfu:
        console.print(f"MFU ({side}): {escape(mfu)}", highlight=False)
    if r.energy:
        console.print(f"{escape(r.energy.label)}: {escape(r.energy.how)}", highlight=False)
    if r.findings:
        console.print(f"\n[bold]Findings[/] ({len(r.findings)})")
        for f in r.findings:
            gain = fmt_speedup(f.speedup)
            gain = f"  [{'measured' if f.measured else 'estimated'} {gain}]" if gain != "-" else ""
            console.print(f"  [bold]{escape(f.code)}[/] {escape(f.name)}: {escape(f.message)}{escape(gain)}",
                          highlight=False)
            if f.basis:
                console.print(f"      how: {escape(f.basis)}", highlight=False)
    if r.failed:
        console.print("\n[bold]Failed probes[/]")
        for row in r.failed:
            console.print(f"  {escape(row.id)} {escape(row.changed)}: [red]{escape(row.status)}[/] — "
                          f"{escape(row.error)}", highlight=False)
    for title, rows in (("Stopped before a whole window (not failures)", r.stopped),
                        ("Unsupported on this machine", r.unsupported)):
        if rows:
            console.print(f"\n[bold]{title}[/]")
            for row in rows:
                console.print(f"  {escape(row.id)} {escape(row.changed)}: {escape(row.error)}", highlight=False)
    if r.skipped:
        console.print("\n[bold]Not applicable[/]")
        for row in r.skipped:
            reason = row.error.removeprefix("not applicable: ")
            console.print(f"  {escape(row.changed)}: {escape(reason)}", highlight=False)
    for note in r.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    if r.rows:
        console.print("\n[bold]Every probe[/]")
        for row in r.rows:
            detail = fmt_ci(row.throughput) if row.ok else row.error
            console.print(f"  {escape(row.id)} {escape(row.role)}: {escape(row.changed)} — {escape(row.status)} "
                          f"{escape(detail)}", highlight=False)
    if r.unexplored:
        console.print(f"\nUnexplored ({len(r.unexplored)}): " + escape("; ".join(r.unexplored)), highlight=False)
    if r.more_time:
        console.print(escape(r.more_time.text), highlight=False)
    if results_path is not None:
        console.print(f"\nresults: {escape(str(results_path))}", highlight=False)


def comparison_summary(comparison: "view.Comparison", console: Console) -> None:
    """Two runs side by side (`tune-advisor compare`)."""
    c = comparison
    table = Table(title="comparison", title_justify="left")
    table.add_column("")
    table.add_column(escape(c.names[0]), overflow="fold")
    table.add_column(escape(c.names[1]), overflow="fold")
    for what, a, b in c.rows:
        table.add_row(what, escape(a), escape(b))
    console.print(table)
    if c.same_machine is False:
        console.print("[yellow]The runs come from different machines (fingerprints differ): "
                      "compare their numbers with care.[/]")
    if c.ratio is not None:
        console.print(f"recommended throughput, B over A: {c.ratio:.2f}x (ratio of medians of separate runs; no CI)")
    differ = [(k, a, b) for k, a, b, d in c.settings if d]
    if differ:
        console.print("\n[bold]Recommended settings that differ[/]")
        for knob, a, b in differ:
            console.print(f"  {escape(knob)}: {escape(a)} → {escape(b)}", highlight=False)
    if c.findings:
        console.print("\n[bold]Findings[/]")
        for code, name, where in c.findings:
            console.print(f"  {escape(code)} {escape(name)}: {where}", highlight=False)
