"""Does a results.json contradict itself? The checks a report must pass before anyone acts on it.

A finding's fix may not set a knob to another value than the recommendation holds (a next step the run did not
try, TA703's batch advice, is no contradiction), and a next step called untried was not measured by any probe; TA504 may not advise against a compile mode the recommendation
holds; TA702/TA704 may not question a numeric knob the recommendation changed; an `ok` probe has a throughput; a
speedup is stated only for a recommendation that changes something; the baseline's and the recommendation's
figures stand in the ratio of the speedup.
"""

from __future__ import annotations

import re
from typing import Any

ADVICE_AGAINST_COMPILE = re.compile(r"did not train faster|leave it off")
FIGURES_TOLERANCE = 0.01  # the figures are worked out on one level (planner/figures.py): only rounding may differ


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
        for knob, value in ((f.get("fix") or {}).get("settings") or {}).items():
            if knob in rec and rec[knob] != value and code != "TA703" and "not tried" not in message:
                found.append(f"{code} fixes {knob}={value}, the recommendation has {knob}={rec[knob]}")
        if "not tried in this run" in message:  # a next step no probe measured: say so only where none did
            fix = (f.get("fix") or {}).get("settings") or {}
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
    for p in document.get("probes") or []:
        if p.get("status") == "ok" and not (p.get("throughput") or {}).get("median"):
            found.append(f"probe {p.get('id')} is 'ok' without a throughput")
    return found


def _figures_ratio(figures: dict[str, Any]) -> float | None:
    """The recommendation's figure over the baseline's; None where either is missing."""
    base, rec = ((figures.get(side) or {}).get("median") for side in ("baseline", "recommended"))
    ok = all(isinstance(x, (int, float)) and x > 0 for x in (base, rec))
    return rec / base if ok else None
