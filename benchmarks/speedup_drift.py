"""How far a speedup moves between an analysis and a later measure of it: calibrates figures.SPEEDUP_DRIFT.

A confirmation's CI (results.json `speedup`) comes from rounds spread over a few minutes of one analysis; it cannot
show how far the ratio itself moves over the next minutes to hours, as the two settings meet the shared machine in
another mood. benchmarks/reproducibility.py measures each run's speedup again later (its re-measure, with its own
CI). For each such pair this prints, over all rows and per machine:
  within ±5%: the runs whose reported speedup lies within ±5% of the re-measured one (the issue's (c));
  inside: the runs where the two agree within their own intervals (each side's log half-width added in
          quadrature: `reproducibility.ratio_interval`), with no drift between them, and with SPEEDUP_DRIFT;
  level: the smallest drift (log sd) with which those intervals hold --coverage of the runs
         (`stats.between_for_coverage`, split conformal, as benchmarks/session_drift.py does for the throughputs);
         beside it the method of moments (normal shifts: the shifts are heavy-tailed, most runs agreeing within
         their noise and a few moving 8-17%, so moments read lower and cover fewer);
and, leaving one source (a docs section, a benchmark run) out at a time, the level calibrated on the others and
the share of the left-out rows it holds.

The rows are in benchmarks/speedup_drift.csv: those of the tables in docs/planner.md ("Do the numbers hold up on a
second look?", 136 runs of 2026-11-25 to 28 on AMD EPYC and Intel Xeon machines, each the reported and the
re-measured speedup with their 95% CIs as the benchmark printed them), then runs added with --add; runs that kept
the baseline (1.00x by identity) are not rows. `--add RUN_DIR ...` appends the runs of reproducibility.py folders
("analyses kept in").

    python benchmarks/speedup_drift.py                       # the committed rows
    python benchmarks/speedup_drift.py RUN_DIR ... [--add] [--source LABEL] [--exclude cnn-1,...]
                                                             # with these runs (and keep them)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from reproducibility import ratio_interval, remeasured_speedup
from tune_advisor import environment
from tune_advisor.analysis import stats
from tune_advisor.planner import figures

CSV = Path(__file__).with_name("speedup_drift.csv")
FIELDS = ["source", "machine", "fixture", "run", "reported", "reported_low", "reported_high", "remeasured",
          "remeasured_low", "remeasured_high"]
TOLERANCE = math.log(1.05)  # (c)'s ±5%, on the log scale the ratio's noise lives on


def rows_of(run_dir: Path, source: str | None = None, exclude: tuple[str, ...] = ()) -> list[dict]:
    """One row per run in `run_dir` (reproducibility.py's folder) that recommended a change, with its re-measure,
    labelled `source` (default: the folder's name); the analyses named in `exclude` left out."""
    rows = []
    for analysis in sorted(p for p in run_dir.iterdir() if (p / "remeasures.json").is_file()):
        if analysis.name in exclude:
            continue
        doc = json.loads((analysis / "results.json").read_text())
        again = json.loads((analysis / "remeasures.json").read_text())
        speedup = doc.get("speedup") or {}
        if speedup.get("ci_low") is None or not again["baseline"]:
            continue
        centre, low, high = remeasured_speedup(again["baseline"], again["recommended"])
        cpu = machine((doc.get("environment") or {}).get("cpu_model") or "")
        rows.append({"source": source or run_dir.name, "machine": cpu, "fixture": again["fixture"], "run": again["run"],
                     "reported": f"{speedup['median']:.4f}", "reported_low": f"{speedup['ci_low']:.4f}",
                     "reported_high": f"{speedup['ci_high']:.4f}", "remeasured": f"{centre:.4f}",
                     "remeasured_low": f"{low:.4f}", "remeasured_high": f"{high:.4f}"})
    return rows


def machine(cpu_model: str) -> str:
    """The machine's kind as the committed rows name it: 'Intel(R) Xeon(R) Processor' -> 'Intel Xeon'."""
    return " ".join(re.sub(r"\((R|TM)\)", "", cpu_model).split()[:2]) or "unknown"


def deviations(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's log(reported / re-measured), and the two figures' own half-width (95%) on that side."""
    dev, half = [], []
    for r in rows:
        ratio, low, high = ratio_interval(*((float(r[k]), float(r[f"{k}_low"]), float(r[f"{k}_high"]))
                                            for k in ("reported", "remeasured")))
        d = math.log(ratio)
        dev.append(d)
        half.append(math.log(ratio / low) if d > 0 else math.log(high / ratio))
    return np.array(dev), np.array(half)


def inside(rows: list[dict], level: float) -> int:
    dev, half = deviations(rows)
    return int(np.sum(np.abs(dev) <= np.hypot(half, stats.Z95 * level) + 1e-12))


def summary(label: str, rows: list[dict], coverage: float) -> None:
    dev, half = deviations(rows)
    level = stats.between_for_coverage(dev, half, coverage)
    moments = math.sqrt(max(0.0, float(np.mean(dev ** 2) - np.mean((half / stats.Z95) ** 2))))
    within = int(np.sum(np.abs(dev) <= TOLERANCE))
    print(f"{label}: {len(rows)} runs; within ±5%: {within}; inside their two intervals with no drift: "
          f"{inside(rows, 0.0)} ({inside(rows, 0.0) / len(rows):.0%}), with SPEEDUP_DRIFT "
          f"{figures.SPEEDUP_DRIFT:.3f}: {inside(rows, figures.SPEEDUP_DRIFT)}; level for {coverage:.0%}: "
          f"{level:.4f} (moments: {moments:.4f}); mean log deviation {float(np.mean(dev)):+.4f} ± "
          f"{float(np.std(dev, ddof=1) / math.sqrt(len(dev))):.4f} (se)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="*", type=Path, help="reproducibility.py folders to add")
    parser.add_argument("--add", action="store_true", help="append their rows to speedup_drift.csv")
    parser.add_argument("--source", help="the added rows' label (default: each folder's name)")
    parser.add_argument("--exclude", default="", help="analyses to leave out, by folder name (cnn-1,...): one "
                        "that something beside the benchmark disturbed")
    parser.add_argument("--coverage", type=float, default=0.95)
    args = parser.parse_args(argv)
    with CSV.open() as f:
        rows = list(csv.DictReader(f))
    exclude = tuple(name for name in args.exclude.split(",") if name)
    new = [row for run in args.runs for row in rows_of(run, args.source, exclude)]
    if args.add and new:
        with CSV.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=FIELDS).writerows(new)
    rows += new
    print(environment.machine_line("cpu"))
    print("(this machine runs nothing here: the rows were measured where their `machine` column says)")
    summary("all", rows, args.coverage)
    by_machine, by_source = defaultdict(list), defaultdict(list)
    for r in rows:
        by_machine[r["machine"]].append(r)
        by_source[r["source"]].append(r)
    for machine, group in sorted(by_machine.items()):
        summary(f"  {machine}", group, args.coverage)
    held = total = 0
    for source, group in by_source.items():
        others = [r for r in rows if r["source"] != source]
        dev, half = deviations(others)
        level = stats.between_for_coverage(dev, half, args.coverage)
        held, total = held + inside(group, level), total + len(group)
    print(f"leaving one source out at a time ({len(by_source)} sources): the level calibrated on the others held "
          f"{held}/{total} of the left-out rows ({held / total:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
