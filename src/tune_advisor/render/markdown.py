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


def render(document: Mapping[str, Any], cost_per_hour: float | None = None) -> str:
    """report.md for one results.json document (`cost_per_hour`: an epoch's cost before and after)."""
    r = view.build(document, cost_per_hour=cost_per_hour)
    out = [f"## tune-advisor: {escape(r.title)}", ""]
    out += _verdict(r)
    if r.more_time:
        out += [f"{escape(r.more_time.lead)} {code(r.more_time.command)}", ""]
    if r.snippet:
        out += ["### Apply it", "", block(r.snippet, "python"), ""]
    if r.run_command:
        out += ["Or run the script with its own flags:", "", block(r.run_command, "sh"), ""]
        if r.run_command_rest:
            out += [f"and {escape(r.run_command_rest)}", ""]
    if len(r.staircase) > 1:
        out += ["### What each change bought", "", "| change | its own speedup | running product |", "|---|---|---|"]
        out += [f"| {code(s.label, True)} | {escape(fmt_speedup(s.figure))} | {s.cumulative:.2f}x |"
                for s in r.staircase]
        out += ["", escape(r.staircase_note), ""]
    changed = [row for row in r.settings_rows if row.changed]
    if changed:
        out += ["| knob | baseline | recommended |", "|---|---|---|"]
        out += [f"| {code(row.knob, True)} | {escape(fmt_value(row.baseline))} | "
                f"**{escape(fmt_value(row.recommended))}** |" for row in changed]
        out.append("")
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
    if r.skipped:
        out += [f"<details><summary>Not applicable here ({len(r.skipped)})</summary>", "",
                *[f"- {code(p.changed)}: {escape(p.error.removeprefix('not applicable: '))}" for p in r.skipped],
                "", "</details>", ""]
    if r.unexplored:
        out += [f"<details><summary>Unexplored ({len(r.unexplored)})</summary>", "",
                *[f"- {escape(u)}" for u in r.unexplored], "", "</details>", ""]
    footer = (f"tune-advisor {escape(r.version or '?')} · {len(r.rows)} probes in "
              f"{fmt_seconds(r.budget.used_s)} · {escape(r.environment[0][1] if r.environment else '?')}")
    if r.command:
        footer += f" · reproduce: {code(r.command)}"
    out += [f"<sub>{footer}</sub>", ""]
    if r.headline:
        out += _footnote(r)
    return "\n".join(out)


def _verdict(r: view.Report) -> list[str]:
    """The verdict in one sentence, what it means for an epoch, one caveat where it matters; the derivation of
    each figure is a footnote."""
    if not r.headline:
        return [f"**{escape(r.verdict)}**", ""]
    settings = knobs.describe(r.changes)
    sentence = r.headline.removeprefix(f"Change {settings}: ")  # the settings as code, the rest as text
    out = [f"**Change {code(settings)}: {escape(sentence)}**[^how]", ""]
    facts = [f"{escape(what)}: {escape(value)}" for what, value in r.epoch]
    facts += [f"peak memory {fmt_bytes(r.baseline.peak_memory_bytes)} → {fmt_bytes(r.recommended.peak_memory_bytes)}"]
    out += [" · ".join(facts), ""]
    if r.caveat:
        out += [f"> [!NOTE]\n> {escape(r.caveat)}", ""]
    return out


def _footnote(r: view.Report) -> list[str]:
    """How this was measured: every interval's derivation (the footnote of the verdict)."""
    parts = [f"baseline {fmt_ci(r.figures['baseline'])}: {r.figures['baseline']['interval']}"]
    if r.changes:
        parts.append(f"recommended {fmt_ci(r.figures['recommended'])}: {r.figures['recommended']['interval']}")
    if r.speedup and r.speedup.get("median") is not None:
        parts.append(f"confirmed speedup {fmt_speedup(r.speedup)}: {r.speedup.get('method') or 'method not recorded'}"
                     + (f"; {r.speedup['interval']}" if r.speedup.get("interval") else ""))
        if fmt_later(r.speedup):
            parts.append(f"{fmt_later(r.speedup)}: {r.speedup['later']['interval']}")
    parts += [f"MFU ({side}): {text}" for side, text in r.mfu]
    if r.energy:
        parts.append(f"{r.energy.label} {r.energy.change}: {r.energy.how}")
    if r.batch_note:
        parts.append(r.batch_note)
    return ["[^how]: How this was measured. " + escape(" — ".join(parts)), ""]


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
