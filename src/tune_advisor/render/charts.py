"""Charts for report.html: matplotlib figures written as inline SVG (text as text, no external references).

Axes and labels are drawn in a placeholder colour that becomes `currentColor`, so a chart follows the page's
light or dark theme. Each function returns None when the document holds nothing to draw.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from dataclasses import dataclass
from typing import Any

from .. import knobs
from . import view

_INK = "#0b0c0d"  # replaced by currentColor in the SVG text; unlikely to be a colour we draw with
BLUE, GREEN, GREY, RED, ORANGE = "#3b82f6", "#16a34a", "#9ca3af", "#dc2626", "#f59e0b"
SERIES = [BLUE, ORANGE, GREEN, "#a855f7", "#ec4899"]
_RC = {
    "svg.fonttype": "none",  # text stays text: smaller, selectable, uses the page's font
    "svg.hashsalt": "tune-advisor",  # stable element ids, so re-rendering the same file gives the same bytes
    "text.parse_math": False,  # a '$' in a label is a dollar, never mathtext (nor a mathtext error)
    "font.family": "sans-serif",
    "font.size": 9,
    "text.color": _INK, "axes.labelcolor": _INK, "axes.edgecolor": _INK,
    "xtick.color": _INK, "ytick.color": _INK, "grid.color": _INK, "grid.alpha": 0.15,
    "axes.spines.top": False, "axes.spines.right": False,
    "figure.facecolor": "none", "axes.facecolor": "none", "savefig.facecolor": "none",
    "legend.frameon": False,
}


@dataclass
class Chart:
    id: str
    title: str
    caption: str
    svg: str


def charts(report: view.Report) -> list[Chart]:
    """Every chart the document has data for, in report order."""
    made = [waterfall_chart(report), breakdown_chart(report), batch_chart(report), timeline_chart(report)]
    return [c for c in made if c is not None]


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # the object API: no pyplot global state, no GUI backend

    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig, label: str) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG goes inline in HTML
    text = text.replace(_INK, "currentColor")
    return re.sub(r"<svg ", f'<svg role="img" aria-label="{_attr(label)}" ', text, count=1)


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def _short(text: str, width: int = 44) -> str:
    return textwrap.shorten(text, width=width, placeholder="…")


def _draw(width: float, height: float, label: str, paint) -> str:
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig = _figure(width, height)
        paint(fig)
        return _svg(fig, label)


def waterfall_chart(report: view.Report) -> Chart | None:
    """Each kept change's own contribution to the confirmed speedup, as steps of a running product (log scale,
    so that a 2x step is as tall wherever it stands), ending at the confirmed speedup with its CI."""
    stairs = report.staircase
    if len(stairs) < 3:  # one change: its bar would be the confirmed one again
        return None

    def paint(fig):
        ax = fig.add_subplot()
        before = 1.0
        for i, s in enumerate(stairs):
            if s.kind == "total":
                f = s.figure
                ax.bar(i, math.log(f["median"]), color=GREEN, width=0.6)
                if f.get("ci_low") is not None and f.get("ci_high") is not None:
                    ax.errorbar(i, math.log(f["median"]), yerr=[[math.log(f["median"] / f["ci_low"])],
                                                                [math.log(f["ci_high"] / f["median"])]],
                                fmt="none", ecolor=_INK, capsize=3)
                ax.annotate(f"{f['median']:.2f}x", (i, math.log(f["median"])), ha="center", va="bottom",
                            xytext=(0, 3), textcoords="offset points")
                continue
            after = before * s.figure["median"]
            color = GREY if s.kind == "rest" else BLUE if after >= before else RED
            ax.bar(i, math.log(after) - math.log(before), bottom=math.log(before), color=color, width=0.6)
            ax.annotate(f"×{s.figure['median']:.2f}", (i, max(math.log(after), math.log(before))), ha="center",
                        va="bottom", xytext=(0, 3), textcoords="offset points")
            before = after
        levels = [1.0, *(s.cumulative for s in stairs), stairs[-1].figure.get("ci_low") or 1.0]
        low, high = min(levels), max(levels + [stairs[-1].figure.get("ci_high") or 1.0])
        ticks = [t for t in (0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 50, 100) if low / 1.5 <= t <= high * 1.5]
        ax.set_yticks([math.log(t) for t in ticks], [f"{t:g}x" for t in ticks])
        ax.axhline(0, color=_INK, linewidth=0.8)
        ax.set_xticks(range(len(stairs)), [_short(s.label.removeprefix("+ "), 26) for s in stairs])
        ax.set_ylabel("speedup over the baseline (log scale)")
        ax.grid(axis="y")
        ax.set_axisbelow(True)

    svg = _draw(8, 3.0, "each kept change's contribution to the confirmed speedup", paint)
    return Chart("chart-waterfall", "What each change bought", _waterfall_legend(stairs), svg)


def _waterfall_legend(stairs: list[view.Stair]) -> str:
    """The colours the staircase draws, and only those."""
    changes = [s for s in stairs if s.kind == "change"]
    parts = []
    if any(s.figure["median"] >= 1 for s in changes):
        parts.append("blue: a kept change's own contribution (the recommendation with and without it)")
    if any(s.figure["median"] < 1 for s in changes):
        parts.append("red: a kept change that costs on its own (the recommendation with and without it)")
    if any(s.kind == "rest" for s in stairs):
        parts.append("grey: the interaction of the changes (and any change not measured on its own)")
    parts.append("green: the confirmed speedup with its 95% CI")
    text = "; ".join(parts)
    return f"{text[0].upper()}{text[1:]}. The steps multiply to the confirmed speedup."


def batch_chart(report: view.Report) -> Chart | None:
    """Throughput and peak memory against batch size, one line per combination of the other knobs."""
    groups: dict[tuple, dict[int, Any]] = {}
    for r in report.rows:
        settings = r.probe.settings
        bs = settings.get("batch_size")
        if r.ok and isinstance(bs, int) and bs > 0:
            key = view.settings_key({k: v for k, v in settings.items() if k != "batch_size"})
            groups.setdefault(key, {}).setdefault(bs, r)  # the first probe of each batch size
    series = sorted((g for g in groups.values() if len(g) >= 2), key=len, reverse=True)[:len(SERIES)]
    failed = [r for r in report.failed if isinstance(r.probe.settings.get("batch_size"), int)]
    if not series:
        return None
    base = report.baseline.settings if report.baseline else {}
    oom = [r for r in failed if r.status == "oom"]
    frontier = min((r.probe.settings["batch_size"] for r in oom), default=None)

    def paint(fig):
        ax = fig.add_subplot()
        mem = ax.twinx()
        mem.spines["right"].set_visible(True)
        for color, group in zip(SERIES, series):
            points = sorted(group.items())
            xs = [bs for bs, _ in points]
            rest = {k: v for k, v in points[0][1].probe.settings.items() if k != "batch_size"}
            other = knobs.changes(rest, base)
            label = _short(knobs.describe(other) if other else "baseline settings", 40)
            ax.plot(xs, [r.throughput["median"] for _, r in points], "o-", color=color, label=label)
            mem_points = [(bs, r.peak_memory) for bs, r in points if r.peak_memory]
            if mem_points:
                mem.plot([x for x, _ in mem_points], [m / 2**20 for _, m in mem_points], "s--", color=color,
                         alpha=0.6, markersize=4)
        for r in failed:
            ax.plot([r.probe.settings["batch_size"]], [0], "x", color=RED, markersize=8, mew=2)
        if frontier is not None:
            ax.axvline(frontier, color=RED, linestyle=":", linewidth=1.5)
            ax.annotate(f"OOM from batch {frontier}", (frontier, 0.95), xycoords=("data", "axes fraction"),
                        color=RED, ha="right", xytext=(-4, 0), textcoords="offset points")
        ax.set_xscale("log", base=2)
        ticks = sorted({bs for g in series for bs in g} | {r.probe.settings["batch_size"] for r in failed})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("batch size (log scale)")
        ax.set_ylabel(f"throughput ({report.unit}), solid")
        mem.set_ylabel("peak memory (MiB), dashed")
        ax.set_ylim(bottom=0)
        mem.set_ylim(bottom=0)
        ax.grid(True)
        fig.legend(loc="outside upper right", ncols=min(3, len(series)), fontsize=8)

    svg = _draw(8, 3.6, "batch size against throughput and peak memory", paint)
    caption = ("Solid: median throughput; dashed: peak memory; one colour per combination of the other knobs. "
               + (f"Red crosses: failed probes; the dotted line marks the first out-of-memory batch size ({frontier})."
                  if frontier is not None else
                  "Red crosses: failed probes." if failed else "No batch size ran out of memory."))
    return Chart("chart-batch", "Batch size against throughput and memory", caption, svg)


def breakdown_chart(report: view.Report) -> Chart | None:
    """Where a step's time goes, baseline against recommended: waiting for data, and the rest of the step
    (forward, backward and optimizer together: the probes time the step, not its parts)."""
    sides = [(label, row) for label, row in (("baseline", _row(report, report.baseline)),
                                             ("recommended", _row(report, report.recommended) if report.changes
                                              else None))
             if row is not None and row.step_mean is not None and row.wait_frac is not None]
    if not sides:
        return None

    def paint(fig):
        ax = fig.add_subplot()
        y = list(range(len(sides)))[::-1]
        # per sample, so that a larger batch's longer step compares fairly with the baseline's
        per = [row.step_mean / _items(row) * 1e3 for _, row in sides]
        wait = [p * row.wait_frac for p, (_, row) in zip(per, sides)]
        rest = [p - w for p, w in zip(per, wait)]
        ax.barh(y, wait, color=ORANGE, height=0.6, label="waiting for data")
        ax.barh(y, rest, left=wait, color=BLUE, height=0.6,
                label="forward + backward + optimizer (not timed apart)")
        ax.set_yticks(y, [label if label == "baseline" else f"{label}\n{_short(row.changed, 30)}"
                          for label, row in sides])
        ax.set_xlabel("mean step time per sample (ms)")
        ax.grid(axis="x")
        ax.set_axisbelow(True)
        fig.legend(loc="outside upper right", ncols=2, fontsize=8)

    svg = _draw(8, 1.2 + 0.6 * len(sides), "where a step's time goes", paint)
    mfu = "; ".join(f"MFU {side}: {text}" for side, text in report.mfu)
    return Chart("chart-breakdown", "Where a step's time goes",
                 "Mean measured step time per sample, split into the share spent blocked on the next batch "
                 "(data_wait_frac) and the rest of the step; forward, backward and the optimizer step are not "
                 "timed apart by the probes." + (f" {mfu}." if mfu else ""), svg)


def _row(report: view.Report, probe) -> "view.Row | None":
    return next((r for r in report.rows if probe is not None and r.id == probe.id and r.ok), None)


def _items(row: "view.Row") -> float:
    """Items per step: the probe's batch size (samples); 1 where unknown (then the bar is per step)."""
    bs = row.probe.settings.get("batch_size")
    return float(bs) if isinstance(bs, int) and bs > 0 else 1.0


def timeline_chart(report: view.Report) -> Chart | None:
    """NVML samples over time for the probes that recorded a `gpu.timeline` ({t_s: [...], <metric>: [...]}, as
    collectors/nvml.py writes it: util, mem_gib, power_w, sm_clock_mhz; None where a sample was missing)."""
    timed = []
    for r in report.rows:
        timeline = r.probe.gpu.timeline if r.probe.gpu is not None else None
        t = timeline.get("t_s") if timeline else None
        if t:
            metrics = {k: v for k, v in timeline.items() if k != "t_s" and len(v) == len(t)}
            if metrics:
                timed.append((r, t, metrics))
    if not timed:
        return None
    names = list(dict.fromkeys(k for _, _, m in timed for k in m))[:4]
    timed = timed[:len(SERIES)]

    def paint(fig):
        axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
        for ax, name in zip(axes, names):
            for color, (r, t, metrics) in zip(SERIES, timed):
                if name in metrics:
                    values = [v if v is not None else float("nan") for v in metrics[name]]  # gaps
                    ax.plot(t, values, color=color, label=r.id, linewidth=1)
            ax.set_ylabel(_short(name, 20))
            ax.grid(True)
        axes[0].legend(loc="upper right", fontsize=8, ncols=len(timed))
        axes[-1].set_xlabel("time in probe (s)")

    svg = _draw(8, 0.6 + 1.4 * len(names), "GPU timeline", paint)
    return Chart("chart-timeline", "GPU timeline (NVML)", "NVML samples recorded during each probe.", svg)
