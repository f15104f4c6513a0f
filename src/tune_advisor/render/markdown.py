"""report.md: the verdict, the settings and the findings as GitHub-flavoured Markdown (PR comments, CI summaries).

GitHub renders raw HTML inside Markdown, so every piece of text from the document is escaped: HTML characters as
entities, Markdown punctuation with backslashes, code in spans or fences longer than any backtick run inside.
"""

from __future__ import annotations

import html
import re
from typing import Any, Mapping

from .. import knobs
from ..fmt import fmt_bytes, fmt_ci, fmt_later, fmt_pct, fmt_seconds, fmt_speedup, fmt_value
from . import view

output_file_extension = "md"
# Inline Markdown syntax; HTML is handled by entities, and line-start syntax (#, -, 1.) never starts our lines.
_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def escape(text: Any) -> str:
    """Plain text that Markdown shows as is: no HTML, no emphasis, no links, one line."""
    text = " ".join(str(text).split())
    return _SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def code(text: Any, in_table: bool = False) -> str:
    """An inline code span that no backtick inside can close early."""
    text = " ".join(str(text).split())
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    span = f"{fence}{pad}{text}{pad}{fence}"
    return span.replace("|", "\\|") if in_table else span  # GFM splits cells on '|' even inside code spans


def block(text: str, lang: str = "") -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def render(document: Mapping[str, Any]) -> str:
    """report.md for one results.json document."""
    r = view.build(document)
    base, rec = r.baseline, r.recommended
    out = [f"## tune-advisor: {escape(r.title)}", ""]
    if not r.baseline_ok or not r.changes:
        out += [f"**{escape(r.verdict)}**", ""]
    else:
        speed = fmt_speedup(r.speedup) if r.speedup else "-"
        how = escape((r.speedup or {}).get("method") or "method not recorded")
        out += [f"**{escape(fmt_ci(r.figures['baseline']))} → {escape(fmt_ci(r.figures['recommended']))}** "
                f"with {code(knobs.describe(r.changes))}"
                + (f": **{escape(speed)} faster** (confirmation: {how})." if speed != "-"
                   else " (speedup not confirmed by a re-measurement beside the baseline)."), ""]
    if r.baseline_ok:
        out += ["| | baseline | recommended |", "|---|---|---|",
                f"| settings | {code(knobs.describe(base.settings), True)} | "
                f"{code(knobs.describe(r.changes), True) if r.changes else 'unchanged'} |",
                f"| throughput | {escape(fmt_ci(r.figures['baseline']))} | "
                f"{escape(fmt_ci(r.figures['recommended']))} |",
                f"| its interval | {escape(r.figures['baseline']['interval'])} | "
                f"{escape(r.figures['recommended']['interval'])} |",
                f"| peak memory | {fmt_bytes(base.peak_memory_bytes)} | "
                f"{fmt_bytes(rec and rec.peak_memory_bytes)} |",
                f"| probe | {escape(base.id)} | {escape(rec.id if rec else '-')} |", ""]
        if r.speedup and r.speedup.get("method"):
            out += [f"Speedup method: {escape(r.speedup['method'])}.", ""]
        if fmt_later(r.speedup):
            out += [f"Speedup {escape(fmt_later(r.speedup))} ({escape(r.speedup['later']['interval'])}).", ""]
        if r.batch_note:
            out += [f"> [!NOTE]\n> {escape(r.batch_note)}", ""]
    if r.snippet:
        out += ["### Apply it", "", block(r.snippet, "python"), ""]
    if r.run_command:
        out += ["Or run the script with its own flags:", "", block(r.run_command, "sh"), ""]
        if r.run_command_rest:
            out += [f"and {escape(r.run_command_rest)}", ""]
    out += [f"### Findings ({len(r.findings)})", ""]
    if not r.findings:
        out += ["No findings recorded for this run.", ""]
    for i, f in enumerate(r.findings, 1):
        head = f"{i}. **{escape(f.code)} {escape(f.name)}**" + (f" ({escape(f.severity)})" if f.severity else "")
        out.append(f"{head}: {escape(f.message)}")
        gain = _gain(f)
        if gain:
            out.append(f"   - gain: {gain}")
        if f.fix_settings:
            out.append(f"   - fix: {code(knobs.describe(f.fix_settings))}")
        if f.evidence:
            out.append("   - evidence: " + "; ".join(f"{escape(k)} = {escape(fmt_value(v))}" for k, v in f.evidence)
                       + (f" (probes {escape(', '.join(f.probes))})" if f.probes else ""))
        if f.snippet:
            out += ["", "\n".join("   " + line for line in block(f.snippet, "python").splitlines()), ""]
    out.append("")
    if r.failed:
        out += ["### Failed probes", ""]
        out += [f"- {escape(p.id)} {code(p.changed)}: **{escape(p.status)}**: {escape(p.error or 'no cause recorded')}"
                for p in r.failed]
        out.append("")
    for title, rows in (("Stopped before a whole window (not failures)", r.stopped),
                        ("Unsupported on this machine", r.unsupported)):
        if rows:
            out += [f"### {title}", ""]
            out += [f"- {escape(p.id)} {code(p.changed)}: {escape(p.error or 'no cause recorded')}" for p in rows]
            out.append("")
    if r.unexplored:
        out += [f"Unexplored ({len(r.unexplored)}): " + escape("; ".join(r.unexplored)), ""]
    footer = (f"tune-advisor {escape(r.version or '?')} · {len(r.rows)} probes in "
              f"{fmt_seconds(r.budget.used_s)} · {escape(r.environment[0][1] if r.environment else '?')}")
    if r.command:
        footer += f" · reproduce: {code(r.command)}"
    out += [f"<sub>{footer}</sub>", ""]
    return "\n".join(out)


def _gain(f: view.Finding) -> str:
    parts = []
    if f.speedup is not None and fmt_speedup(f.speedup) != "-":
        parts.append(escape(fmt_speedup(f.speedup)))
    if f.time_saved_frac is not None:
        parts.append(f"saves {fmt_pct(f.time_saved_frac)} of step time")
    if not parts:
        return ""
    label = "measured" if f.measured else "*estimated*" if f.measured is False else ""
    return " ".join([label, ", ".join(parts)]).strip()
