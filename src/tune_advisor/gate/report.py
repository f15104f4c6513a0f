"""The gate's outputs: a terminal verdict, Markdown for $GITHUB_STEP_SUMMARY, JUnit XML. Each only formats."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any, Mapping

from rich.console import Console
from rich.table import Table

from .. import knobs
from ..render.markdown import code, escape

ICONS = {"pass": "✅", "warn": "⚠️", "fail": "❌", "error": "❗", "not run": "⏭️"}
HEADLINES = {"pass": "passed", "fail": "regression found", "error": "could not evaluate every check",
             "refused": "refused: the baseline is from other hardware"}
STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red", "error": "red", "not run": "dim"}


def _reference_text(document: Mapping[str, Any]) -> str:
    ref = document.get("reference") or {}
    if ref.get("kind") == "git-ref":
        return f"git ref {ref.get('ref')} measured in this job, interleaved"
    if ref.get("kind") == "baseline":
        return f"baseline {ref.get('path')} (recorded {ref.get('created') or 'at an unknown time'})"
    return "absolute limits only"


def terminal(document: Mapping[str, Any], console: Console) -> None:
    verdict = document.get("verdict", "error")
    style = STYLES.get(verdict, "bold red")
    console.print(f"[{style}]gate {HEADLINES.get(verdict, verdict)}[/] — {document['workload']['path']} vs "
                  f"{_reference_text(document)}", highlight=False)
    if document.get("reason"):
        console.print(document["reason"], markup=False, highlight=False)
    if document.get("checks") and verdict != "refused":
        table = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
        table.add_column("check")
        table.add_column("result")
        table.add_column("details", overflow="fold")
        for c in document["checks"]:
            table.add_row(c["check"], f"[{STYLES.get(c['status'], '')}]{c['status']}[/]", c["message"])
        console.print(table)
    for warning in document.get("warnings") or []:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)


def markdown(document: Mapping[str, Any]) -> str:
    """GitHub-flavoured Markdown: a headline, one table row per check, warnings, settings and the machine."""
    verdict = document.get("verdict", "error")
    lines = [f"### {ICONS.get('fail' if verdict == 'refused' else verdict, '')} tune-advisor gate: "
             f"{escape(HEADLINES.get(verdict, verdict))}", "",
             f"Workload {code(document['workload']['path'])} compared with {escape(_reference_text(document))}.", ""]
    if document.get("reason"):
        lines += [escape(document["reason"]), ""]
    checks = document.get("checks") or []
    if checks:
        lines += ["| check | result | details |", "|---|---|---|"]
        for c in checks:
            lines.append(f"| {code(c['check'], in_table=True)} | {ICONS.get(c['status'], '')} {escape(c['status'])} "
                         f"| {escape(c['message'])} |")
        lines.append("")
    for warning in document.get("warnings") or []:
        lines.append(f"- warning: {escape(warning)}")
    if document.get("warnings"):
        lines.append("")
    env = document.get("environment") or {}
    settings = document.get("settings")
    if settings:
        lines += [f"Settings: {code(knobs.describe(settings, knobs.defaults()), in_table=False)}", ""]
    gpu = env.get("gpu") or {}
    machine = ", ".join(str(x) for x in (gpu.get("name"), env.get("cpu_model"),
                                         f"{env.get('cpu_count')} cores" if env.get("cpu_count") else None,
                                         f"torch {env.get('torch')}" if env.get("torch") else None) if x)
    if machine:
        lines += [f"Machine: {escape(machine)}", ""]
    return "\n".join(lines)


def junit(document: Mapping[str, Any]) -> str:
    """JUnit XML: one testcase per check; a failure (regression) or error (not evaluated) carries the numbers."""
    checks = document.get("checks") or []
    failures = sum(c["status"] == "fail" for c in checks)
    errors = sum(c["status"] in ("error", "not run") for c in checks)
    suite = ET.Element("testsuite", name="tune-advisor gate", tests=str(len(checks)), failures=str(failures),
                       errors=str(errors), skipped="0", timestamp=str(document.get("created") or ""))
    workload = str(document["workload"]["path"])
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname=f"tune_advisor.gate.{_classname(workload)}",
                             name=c["check"])
        if c["status"] == "fail":
            ET.SubElement(case, "failure", message=c["message"], type="PerformanceRegression").text = c["message"]
        elif c["status"] in ("error", "not run"):
            ET.SubElement(case, "error", message=c["message"], type="GateError").text = c["message"]
        else:
            ET.SubElement(case, "system-out").text = f"{c['status']}: {c['message']}"
    for warning in document.get("warnings") or []:
        ET.SubElement(suite, "system-err").text = f"warning: {warning}"
    root = ET.Element("testsuites", name="tune-advisor", tests=str(len(checks)), failures=str(failures),
                      errors=str(errors))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _classname(path: str) -> str:
    stem = path.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in stem) or "workload"
