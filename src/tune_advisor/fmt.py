"""Number formatting for every text the tool shows: the renderers' figures and the rules' finding messages.

A leaf module (it imports nothing from the package), so rules can word their numbers without importing render.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

DASH = "-"


def _missing(value: Any) -> bool:
    return value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)


def fmt_rate(value: float | None, unit: str = "", significant_below: float = 10) -> str:
    """A throughput: from 100 a whole number with thousands separators, below `significant_below` 3 significant
    digits, in between one decimal. Reports use 10 (40.0 samples/s); findings' messages pass 100 (40 samples/s)."""
    if _missing(value):
        return DASH
    if value >= 100:
        text = f"{value:,.0f}"
    else:
        text = f"{value:.3g}" if value < significant_below else f"{value:.1f}"
    return f"{text} {unit}".strip()


def fmt_bytes(value: int | None, digits: int = 2) -> str:
    """A size in binary units with `digits` decimals (reports 2, findings' messages 1); "-" for none or zero."""
    if _missing(value) or not value:
        return DASH
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.{digits}f} {unit}"
    return f"{value:.0f} B"


def fmt_ci(throughput: Mapping[str, Any] | None, with_unit: bool = True) -> str:
    """`{median, ci_low, ci_high, unit}` -> '225.7 [222.0, 229.0] samples/s'."""
    t = throughput or {}
    if _missing(t.get("median")):
        return DASH
    unit = str(t.get("unit") or "") if with_unit else ""
    if _missing(t.get("ci_low")) or _missing(t.get("ci_high")):  # a window too short to resample has no interval
        return f"{fmt_rate(t['median'])} {unit}".strip()
    return f"{fmt_rate(t['median'])} [{fmt_rate(t.get('ci_low'))}, {fmt_rate(t.get('ci_high'))}] {unit}".strip()


def fmt_speedup(value: Any) -> str:
    """A ratio, or `{median, ci_low, ci_high}` -> '2.29x (95% CI 2.21–2.38)'."""
    if isinstance(value, Mapping):
        if _missing(value.get("median")):
            return DASH
        text = f"{value['median']:.2f}x"
        if not _missing(value.get("ci_low")) and not _missing(value.get("ci_high")):
            text += f" (95% CI {value['ci_low']:.2f}–{value['ci_high']:.2f})"
        return text
    return DASH if _missing(value) else f"{value:.2f}x"


def fmt_later(speedup: Any) -> str:
    """Where a later measure of a confirmed speedup is expected to fall (its `later`), '1.74–2.10x in a later
    session'; '' where it has none."""
    later = speedup.get("later") if isinstance(speedup, Mapping) else None
    if not isinstance(later, Mapping) or _missing(later.get("ci_low")) or _missing(later.get("ci_high")):
        return ""
    return f"{later['ci_low']:.2f}–{later['ci_high']:.2f}x in a later session"


def fmt_pct(fraction: float | None, digits: int = 1) -> str:
    return DASH if _missing(fraction) else f"{fraction * 100:.{digits}f}%"


def fmt_ms(seconds: float | None) -> str:
    return DASH if _missing(seconds) else f"{seconds * 1e3:.2f} ms"


def fmt_seconds(seconds: float | None) -> str:
    if _missing(seconds):
        return DASH
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def fmt_value(value: Any) -> str:
    """A piece of evidence or a setting, compactly: floats to 4 significant digits, containers as JSON."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    return DASH if value is None else str(value)
