"""Does a results.json contradict itself? The checks a report must pass before anyone acts on it.

A finding's fix may not set a knob to another value than the recommendation holds, nor may its code write another
batch size or worker count where it advises on that knob or advises nothing (a next step the run did not try,
TA703's batch advice, is no contradiction), and a next step called untried was not measured by any probe; TA504 may not advise against a compile mode the recommendation
holds; TA702/TA704 may not question a numeric knob the recommendation changed; an `ok` probe has a throughput; a
speedup is stated only for a recommendation that changes something; the baseline's and the recommendation's
figures stand in the ratio of the speedup, and the energy figures in the ratio they state.

One figure per comparison: `kept_contribution` is the figure a kept change is quoted with everywhere (the rules'
findings and the report's staircase both read it), and `shown_contradictions` checks a rendered report.html for two
different figures for one comparison (the figures the HTML marks with `data-change` and `data-speedup`), or two
different energy figures (`data-energy`).
"""

from __future__ import annotations

import re
from typing import Any

ADVICE_AGAINST_COMPILE = re.compile(r"did not train faster|leave it off")
FIGURES_TOLERANCE = 0.01  # the figures are worked out on one level (planner/figures.py): only rounding may differ
# A figure a report shows: <... data-change="amp=bf16" data-speedup="2.13"> (the change, or "recommended")
_SHOWN = re.compile(r'data-change="([^"]*)"\s+data-speedup="([0-9.]+)"')
# The energy per item a report shows, baseline's and recommendation's joules: <... data-energy="0.0312 0.0253">
_SHOWN_ENERGY = re.compile(r'data-energy="([^"]*)"')
# A value a finding's code writes for a knob: DataLoader(..., batch_size=32, num_workers=4)
_CODE_VALUE = {knob: re.compile(rf"\b{knob}=(\d+)") for knob in ("num_workers", "batch_size")}


def measured_by(probes: list[dict[str, Any]], settings: dict[str, Any]) -> list[str]:
    """The ids of the `ok` probes whose settings hold every value in `settings`."""
    return [p.get("id") for p in probes if p.get("status") == "ok"
            and all((p.get("settings") or {}).get(k) == v for k, v in settings.items())]


def contradictions(document: dict[str, Any]) -> list[str]:
    """One line per contradiction in `document` (empty: it agrees with itself)."""
    rec = (document.get("recommended") or {}).get("settings") or {}
    base = (document.get("baseline") or {}).get("settings") or {}
    changed = {k: v for k, v in rec.items() if base.get(k) != v}
    found = []
    if not changed and (document.get("speedup") or {}).get("median") not in (None, 1, 1.0):
        found.append(f"the recommendation keeps the baseline, yet the speedup reads {document['speedup']['median']:.3g}x")
    for f in document.get("findings") or []:
        code, message = f.get("code", "?"), f.get("message", "")
        fix = (f.get("fix") or {}).get("settings") or {}
        advice = code != "TA703" and "not tried" not in message
        for knob, value in fix.items():
            if knob in rec and rec[knob] != value and advice:
                found.append(f"{code} fixes {knob}={value}, the recommendation has {knob}={rec[knob]}")
        for knob, pattern in _CODE_VALUE.items():
            written = pattern.search((f.get("fix") or {}).get("snippet") or "")
            if written and advice and (knob in fix or not fix) and knob in rec and int(written[1]) != rec[knob]:
                found.append(f"{code}'s code sets {knob}={written[1]}, the recommendation has {knob}={rec[knob]}")
        if "not tried in this run" in message:  # a next step no probe measured: say so only where none did
            measured = measured_by(document.get("probes") or [], fix) if fix else []
            if measured:
                found.append(f"{code} calls {', '.join(f'{k}={v}' for k, v in fix.items())} not tried in this run, "
                             f"yet {', '.join(measured)} measured it")
        if code == "TA504" and changed.get("compile", "off") != "off" and ADVICE_AGAINST_COMPILE.search(message):
            found.append(f"TA504 advises against compile, the recommendation has compile={changed['compile']}")
        if code in ("TA702", "TA704"):
            found += [f"{code} questions {knob}, the recommendation has {knob}={value}"
                      for knob, value in changed.items() if f"{knob}=" in message]
    ratio = _figures_ratio(document.get("figures") or {})
    speedup = (document.get("speedup") or {}).get("median")
    if changed and ratio is not None and isinstance(speedup, (int, float)) and speedup > 0 \
            and abs(ratio / speedup - 1) > FIGURES_TOLERANCE:
        found.append(f"the figures read {ratio:.2f}x the baseline's throughput, the speedup reads {speedup:.2f}x")
    found += _energy_contradictions((document.get("figures") or {}).get("energy") or {})
    for p in document.get("probes") or []:
        if p.get("status") == "ok" and not (p.get("throughput") or {}).get("median"):
            found.append(f"probe {p.get('id')} is 'ok' without a throughput")
    return found


def _energy_contradictions(energy: dict[str, Any]) -> list[str]:
    """The energy figures' ratio against their two medians (figures.energy)."""
    base, rec = ((energy.get(side) or {}).get("median") for side in ("baseline", "recommended"))
    ratio = energy.get("ratio")
    if all(isinstance(x, (int, float)) and x > 0 for x in (base, rec, ratio)) \
            and abs(ratio / (rec / base) - 1) > FIGURES_TOLERANCE:
        return [f"the energy figures read {rec / base:.2f}x the baseline's energy per item, their ratio reads "
                f"{ratio:.2f}x"]
    return []


def _figures_ratio(figures: dict[str, Any]) -> float | None:
    """The recommendation's figure over the baseline's; None where either is missing."""
    base, rec = ((figures.get(side) or {}).get("median") for side in ("baseline", "recommended"))
    ok = all(isinstance(x, (int, float)) and x > 0 for x in (base, rec))
    return rec / base if ok else None


def kept_contribution(document: dict[str, Any], knob: str, value: Any) -> dict[str, Any] | None:
    """What the kept change `knob`=`value` contributed to the recommendation, as the ablation measured it (the
    winner beside itself without the knob: {median, ci_low, ci_high, probes, method, beside}), or None when the
    ablation did not measure it. The one figure a report quotes for that change."""
    for entry in (document.get("plan") or {}).get("ablation") or []:
        c = entry.get("contribution") if isinstance(entry, dict) else None
        if entry.get("knob") == knob and entry.get("value") == value and isinstance(c, dict) \
                and isinstance(c.get("median"), (int, float)):
            return {"median": c["median"], "ci_low": c.get("ci_low"), "ci_high": c.get("ci_high"),
                    "probes": [str(p) for p in entry.get("probes") or []], "method": entry.get("method") or "",
                    "beside": entry.get("beside")}
    return None


def shown_contradictions(page: str) -> list[str]:
    """One line per comparison a rendered report shows with two different figures (each figure as rounded for
    display, to two decimals): the verdict and the staircase's total, a finding and the staircase's stair; and
    where the energy per item is shown twice with different figures (the verdict, its card, how it was measured)."""
    shown: dict[str, set[str]] = {}
    for change, figure in _SHOWN.findall(page):
        shown.setdefault(change, set()).add(f"{float(figure):.2f}")
    found = [f"{change} is shown as {' and '.join(sorted(figures, key=float))}x"
             for change, figures in shown.items() if len(figures) > 1]
    energy = sorted(set(_SHOWN_ENERGY.findall(page)))
    if len(energy) > 1:
        found.append(f"the energy per item is shown as {' and '.join(energy)} J (baseline, recommended)")
    return found
