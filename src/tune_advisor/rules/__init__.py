"""The rules engine: small registered rules read a results.json document and return ranked findings.

    from tune_advisor.rules import RULES, evaluate
    findings = evaluate(document, select=["TA1", "TA4"], ignore=["TA103"])

Each finding is the FINDING object of results.json (SPEC §7). Findings are ranked by the share of time per item
that their fix saves, largest first; findings without a gain follow, errors before warnings before info.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from .. import knobs
from ..consistency import measured_by
from ..errors import UsageError
from .context import Context, Finding
from .registry import FAMILIES, RULES, SEVERITIES, Rule, rule

# Importing a family module registers its rules.
from . import input_pipeline, host, memory, precision, graph, numerics, environment  # noqa: E402,F401  isort:skip
from . import distributed  # noqa: E402,F401  isort:skip  (TA6xx: DDP probes)

__all__ = ["RULES", "FAMILIES", "Rule", "evaluate", "chosen", "rule"]


def parse_prefixes(values: Iterable[str] | None) -> list[str]:
    """['TA1,TA3', ' ta401 '] -> ['TA1', 'TA3', 'TA401']; each must be the prefix of a registered code."""
    prefixes = [part.strip().upper() for value in values or [] for part in str(value).split(",") if part.strip()]
    unknown = [p for p in prefixes if not any(code.startswith(p) for code in RULES)]
    if unknown:
        raise UsageError(f"no rule code starts with {', '.join(unknown)}; valid codes: {', '.join(sorted(RULES))} "
                         "(a prefix like TA1 selects a family)")
    return prefixes


def chosen(select: Iterable[str] | None = None, ignore: Iterable[str] | None = None) -> list[Rule]:
    """The rules matching a `select` prefix (all when none) and no `ignore` prefix, in code order."""
    selected, ignored = parse_prefixes(select), parse_prefixes(ignore)
    return [r for code, r in sorted(RULES.items())
            if (not selected or any(code.startswith(p) for p in selected))
            and not any(code.startswith(p) for p in ignored)]


def evaluate(document: dict[str, Any], select: list[str] | None = None,
             ignore: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the chosen rules over a results.json document; return FINDING dicts ranked by time saved per item."""
    ctx = Context(document)
    recommended = (document.get("recommended") or {}).get("settings") or {}
    findings = []
    for r in chosen(select, ignore):
        found = r.check(ctx)
        if found is not None:
            findings.append(_within_recommendation(to_dict(r, found), recommended, document.get("probes") or []))
    return sorted(findings, key=_rank)


def _within_recommendation(finding: dict[str, Any], recommended: dict[str, Any],
                           probes: list[dict[str, Any]]) -> dict[str, Any]:
    """A finding's fix never contradicts the recommendation: a setting the planner did not keep (or did not try
    in the recommended company) leaves the fix and is named as such. The planner's keep rule and ablation rest on
    comparisons measured side by side, which outrank a rule's reading of separate probes. TA703 (a batch change's
    effect on optimisation) advises on the recommendation itself and is left as it is."""
    fix = finding["fix"]["settings"]
    apart = {k: v for k, v in fix.items() if k in recommended and recommended[k] != v}
    if not apart or finding["code"] == "TA703" or "not tried" in finding["message"]:
        return finding
    tried = measured_by(probes, apart)
    if not finding["gain"].get("measured") and not tried:  # advice on what no probe measured: a next step
        finding["message"] += f"; a next step, not tried in this run: {knobs.describe(apart)}"
        return finding
    if not finding["gain"].get("measured"):  # an estimate, where the run measured the setting (an H200's cnn run
        # said pin_memory was "not tried" beside its own pin_memory probe, which the planner did not keep)
        _leave_out(finding, apart, recommended)
        finding["message"] += (f"; not in the recommendation: {knobs.describe(apart)} was measured in this run "
                               f"({', '.join(tried[:3])}{', …' if len(tried) > 3 else ''}) and the planner did not "
                               "keep it (see how it decided)")
        return finding
    _leave_out(finding, apart, recommended)
    finding["message"] += (f"; not in the recommendation: the planner did not keep {knobs.describe(apart)} beside "
                           "the recommended settings (see how it decided), so re-measure before adopting it")
    return finding


def _leave_out(finding: dict[str, Any], apart: dict[str, Any], recommended: dict[str, Any]) -> None:
    """The settings `apart` leave the finding's fix. Code beside the report's "Apply it" must not set other values
    than the recommendation (TA104 of an H200 run pinned memory at batch 32 beside a recommendation at 128 that did
    not pin): a fix left with nothing has no code (the finding informs), else its code spells the recommendation's
    values for them."""
    finding["fix"]["settings"] = {k: v for k, v in finding["fix"]["settings"].items() if k not in apart}
    snippet = finding["fix"]["snippet"] if finding["fix"]["settings"] else ""
    for knob in apart:
        snippet = re.sub(rf"\b{knob}=[^,)\s]+", f"{knob}={recommended[knob]!r}", snippet)
    finding["fix"]["snippet"] = snippet


def to_dict(r: Rule, f: Finding) -> dict[str, Any]:
    return {
        "code": r.code,
        "name": r.name,
        "severity": r.severity,
        "message": f.message,
        "evidence": f.evidence,
        "fix": {"settings": f.settings, "snippet": f.snippet},
        "gain": f.gain.to_dict(),
        "probes": list(dict.fromkeys(f.probes + f.gain.probes)),
        "docs": f"docs/rules/{r.code}.md",
    }


def _rank(finding: dict[str, Any]) -> tuple:
    saved = finding["gain"]["time_saved_frac"]
    return (-(saved if saved is not None else float("-inf")), SEVERITIES.index(finding["severity"]),
            finding["code"])
