"""How far a machine's level moves between an analysis and a later run: calibrates figures.SESSION_DRIFT.

A figure's 95% prediction interval (results.json `figures`) is built from the spread inside one analysis, which
cannot show how far the machine's level moves over the next minutes to hours; figures.SESSION_DRIFT adds that
level. This benchmark measures it on the analyses benchmarks/reproducibility.py kept: for each re-measure of a
run's baseline or recommended settings, its log distance from the figure's centre, and the figure's half-width
worked out again without the level (`figures.of_document(between=0)`). It prints, per benchmark run and over all:
  inside: the re-measures inside those intervals without the level, and with SESSION_DRIFT as committed;
  level: the smallest level with which the intervals hold --coverage of the re-measures
         (`stats.between_for_coverage`, split conformal: no assumption on the shape of the shifts);
and, leaving one benchmark run out at a time, the level calibrated on the others and the share of the left-out
run's re-measures it holds: what a calibrated level does on a session it has not seen.

One row per re-measure is kept in benchmarks/session_drift.csv (the analyses' results.json run to megabytes), so
the committed level can be worked out again from the repository; `--add` appends the runs given to it. The
half-widths are those of the figure code of the commit that added the rows (column `commit`).

    python benchmarks/session_drift.py                       # the committed rows
    python benchmarks/session_drift.py RUN_DIR ... [--add]   # folders reproducibility.py printed ("analyses kept in")
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from tune_advisor import environment
from tune_advisor.analysis import stats
from tune_advisor.planner import figures

TABLE = Path(__file__).with_name("session_drift.csv")
FIELDS = ("benchmark", "analysis", "created", "cpu", "commit", "side", "centre", "half_low", "half_high",
          "remeasure")


def rows_of(run_dir: Path, commit: str) -> list[dict]:
    """One row per re-measure of each analysis in `run_dir` (a folder holding results.json + remeasures.json)."""
    rows = []
    for analysis in sorted(p for p in run_dir.iterdir() if (p / "remeasures.json").is_file()):
        doc = json.loads((analysis / "results.json").read_text())
        again = json.loads((analysis / "remeasures.json").read_text())
        env = doc.get("environment") or {}
        cpu = environment.machine_line(saved=env).replace("\n", "; ")
        for side, figure in figures.of_document(doc, between=0.0).items():
            if not figure or not figure.get("ci_low"):
                continue
            centre = math.log(figure["median"])
            for rate in again[side]:
                rows.append({"benchmark": run_dir.name, "analysis": analysis.name, "created": doc.get("created"),
                             "cpu": cpu, "commit": commit, "side": side, "centre": f"{centre:.6f}",
                             "half_low": f"{centre - math.log(figure['ci_low']):.6f}",
                             "half_high": f"{math.log(figure['ci_high']) - centre:.6f}",
                             "remeasure": f"{rate:.3f}"})
    return rows


def deviations(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Each re-measure's log distance from its figure's centre, and the figure's half-width on that side."""
    dev = np.array([math.log(float(r["remeasure"])) - float(r["centre"]) for r in rows])
    half = np.array([float(r["half_high"] if d > 0 else r["half_low"]) for r, d in zip(rows, dev)])
    return dev, half


def inside(rows: list[dict], between: float) -> int:
    dev, half = deviations(rows)
    return int(np.sum(np.abs(dev) <= np.hypot(half, stats.Z95 * between) + 1e-12))


def calibrate(rows: list[dict], coverage: float) -> float:
    return stats.between_for_coverage(*deviations(rows), coverage)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="*", type=Path, help="folders reproducibility.py kept its analyses in")
    parser.add_argument("--coverage", type=float, default=0.95, help="the intervals' nominal coverage (0.95)")
    parser.add_argument("--add", action="store_true", help=f"append the runs' rows to {TABLE.name}")
    args = parser.parse_args(argv)
    if args.runs:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip() or "unknown"
        rows = [row for run in args.runs for row in rows_of(run, commit)]
        if args.add:
            new = not TABLE.exists()
            with TABLE.open("a", newline="") as f:
                writer = csv.DictWriter(f, FIELDS)
                if new:
                    writer.writeheader()
                writer.writerows(rows)
            print(f"{len(rows)} rows added to {TABLE}")
    else:
        with TABLE.open(newline="") as f:
            rows = list(csv.DictReader(f))
    if not rows:
        print("no re-measures found (each analysis folder needs results.json and remeasures.json)")
        return 1
    by_run: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_run[row["benchmark"]].append(row)
    for cpu in sorted({r["cpu"] for r in rows}):
        print(cpu)
    committed = figures.SESSION_DRIFT
    print(f"{'benchmark run':<22} {'analyses':>8} {'re-measures':>11} {'inside, no level':>16} "
          f"{f'at {committed:.3f}':>10} {'own level':>9} {'level from the others':>21} {'left-out inside':>15}")
    held = 0
    for run, own in by_run.items():
        others = [r for r in rows if r["benchmark"] != run]
        n = len(own)
        if others:
            level = calibrate(others, args.coverage)
            held_here = inside(own, level)
            held += held_here
            left_out = f"{level:>21.3f} {f'{held_here}/{n}':>15}"
        else:
            left_out = f"{'-':>21} {'-':>15}"
        print(f"{run:<22} {len({r['analysis'] for r in own}):>8} {n:>11} {inside(own, 0.0):>16} "
              f"{inside(own, committed):>10} {calibrate(own, args.coverage):>9.3f} {left_out}")
    n = len(rows)
    level = calibrate(rows, args.coverage)
    print(f"all {len(by_run)} runs, {len({(r['benchmark'], r['analysis']) for r in rows})} analyses, {n} "
          f"re-measures: inside without a level {inside(rows, 0.0)}/{n}; at SESSION_DRIFT {committed:.3f} "
          f"{inside(rows, committed)}/{n}")
    loso = (f"; leaving one run out at a time, the left-out runs hold {held}/{n} ({held / n:.1%})"
            if len(by_run) > 1 else "")
    print(f"level for {args.coverage:.0%} coverage: {level:.4f} (log sd){loso}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
