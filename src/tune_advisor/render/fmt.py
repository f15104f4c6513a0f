"""Number formatting shared by every renderer, so the terminal, HTML and Markdown show the same figures."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

DASH = "-"


def _missing(value: Any) -> bool:
    return value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)


def fmt_rate(value: float | None, unit: str = "") -> str:
    if _missing(value):
        return DASH
    text = f"{value:,.0f}" if value >= 100 else f"{value:.3g}" if value < 10 else f"{value:.1f}"
    return f"{text} {unit}".strip()


def fmt_bytes(value: int | None) -> str:
    if _missing(value) or not value:
        return DASH
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value} B"


def fmt_ci(throughput: Mapping[str, Any] | None, with_unit: bool = True) -> str:
    """`{median, ci_low, ci_high, unit}` -> '225.7 [222.0, 229.0] samples/s'."""
    t = throughput or {}
    if _missing(t.get("median")):
        return DASH
    unit = str(t.get("unit") or "") if with_unit else ""
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
