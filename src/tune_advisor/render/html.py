"""report.html and compare.html: one self-contained file each, rendered with jinja2.

One cached environment loads the templates from the package, escapes every value (autoescape), and inlines the
stylesheet and the sort script. A Content-Security-Policy forbids every fetch; the script runs by its hash.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from typing import Any, Mapping

import jinja2
from markupsafe import Markup

from .. import __version__, fmt, knobs
from ..probe.result import Status
from . import charts as charts_mod
from . import view

output_file_extension = "html"
STATUSES = tuple(status.value for status in Status)
REPORT_SECTIONS = [("verdict", "Verdict"), ("staircase", "Each change"), ("settings", "Settings"),
                   ("findings", "Findings"), ("charts", "Charts"), ("probes", "Probes"),
                   ("environment", "Environment"), ("budget", "Budget"), ("reproduce", "Reproduce")]
COMPARE_SECTIONS = [("summary", "Side by side"), ("settings", "Settings"), ("findings", "Findings")]


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The one jinja2 environment (building it parses nothing; templates are compiled once, then cached)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tune_advisor.render", "templates"),
        autoescape=True,  # every template is HTML: escape all values, whatever the file name
        undefined=jinja2.StrictUndefined,  # a typo in a template fails the tests instead of printing nothing
        trim_blocks=True, lstrip_blocks=True,
    )
    env.filters.update(
        rate=fmt.fmt_rate, bytes=fmt.fmt_bytes, ci=fmt.fmt_ci, speedup=fmt.fmt_speedup, later=fmt.fmt_later,
        pct=fmt.fmt_pct, ms=fmt.fmt_ms, seconds=fmt.fmt_seconds, value=fmt.fmt_value, describe=knobs.describe,
        map_values=lambda items: [(k, fmt.fmt_value(v)) for k, v in items],
    )
    return env


@functools.lru_cache(maxsize=1)
def _assets() -> tuple[Markup, Markup, Markup]:
    """The inlined stylesheet and script, and the CSP that allows exactly them and nothing else."""
    loader = environment().loader
    css, _, _ = loader.get_source(environment(), "assets/report.css")
    script, _, _ = loader.get_source(environment(), "assets/sort.js")
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    # style-src needs 'unsafe-inline': matplotlib's SVG styles its shapes with style="" attributes. Styles cannot
    # fetch anything under default-src 'none' (no fonts, no url() images but data:), so this opens no network path.
    csp = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
           f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'")
    return Markup(css), Markup(script), Markup(csp)  # our own constants: no escaping needed


def _render(template: str, **context: Any) -> str:
    css, script, csp = _assets()
    return environment().get_template(template).render(
        css=css, script=script, csp=csp, version=__version__, known_statuses=STATUSES, **context)


def render(document: Mapping[str, Any], cost_per_hour: float | None = None) -> str:
    """report.html for one results.json document (`cost_per_hour`: an epoch's cost before and after)."""
    r = view.build(document, cost_per_hour=cost_per_hour)
    made = charts_mod.charts(r)
    env_items = dict(r.environment)
    env_line = " / ".join(v for k, v in env_items.items() if k in ("device", "device_name")) or "unknown device"
    return _render("report.html.j2", r=r, base=r.baseline, rec=r.recommended, charts=made,
                   has_timeline=any(c.id == "chart-timeline" for c in made), env_line=env_line,
                   sections=REPORT_SECTIONS)


def render_compare(doc_a: Mapping[str, Any], doc_b: Mapping[str, Any], names: tuple[str, str] = ("A", "B")) -> str:
    """compare.html: two runs side by side."""
    return _render("compare.html.j2", c=view.compare(doc_a, doc_b, names), sections=COMPARE_SECTIONS)
