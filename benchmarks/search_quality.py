"""How close does the adaptive planner get to the grid's optimum, and at what share of its cost? (issue 3)

For every fixture, in one run:
  1. `--strategy grid`: every combination of the fixture's SEARCH (no budget), confirmation included (a finished
     grid run left in the same --out folder is reused: it is the slow part);
  2. the adaptive planner, twice (the second run checks that it recommends the same settings, or settings
     within noise of them);
  3. the grid's fastest configuration and the planners' recommendations re-measured interleaved, ROUNDS rounds
     (G P P' G P P' ...), so machine drift hits all alike. regret = 1 - planner/grid, from the pooled samples.
Cost = the planner's wall time over the grid's (each a whole `analyze`: inspection, probes, confirmation).

    python benchmarks/search_quality.py [FIXTURE.py ...] [--out DIR]

Targets (issue 3): regret <= 5% on every fixture, cost <= 30% of the grid. Rows are saved to DIR/rows.json as each
fixture finishes, and the table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tune_advisor import api, knobs, results
from tune_advisor.analysis import stats
from tune_advisor.errors import UsageError
from tune_advisor.probe.result import ProbeResult
from tune_advisor.probe.spec import Protocol

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ["io_bound.py", "augment_cpu.py", "tiny_batch_mlp.py", "cnn.py", "hf_transformer.py", "lstm_collate.py"]
ROUNDS = 3
# The same protocol for every strategy; shorter than the default so the grids (~250 probes) take minutes.
PROTOCOL = Protocol(warmup_steps=2, min_steps=8, min_time_s=0.5, max_time_s=8.0)
PLANNER_BUDGET = "15m"  # the CLI default: the planner stops on its own long before
REMEASURE = Protocol(warmup_steps=3, min_steps=20, min_time_s=2.0, max_time_s=15.0)  # the verdict: longer runs


def fastest(probes: list[ProbeResult]) -> ProbeResult:
    return max((p for p in probes if p.ok), key=lambda p: p.throughput_median)


def saved_grid(folder: Path) -> api.AnalysisResult | None:
    """A finished grid run from an earlier invocation with the same --out (the grid is the slow part)."""
    try:
        doc = results.read(folder / "results.json")
    except UsageError:
        return None
    if not doc.get("recommended") or doc.get("plan", {}).get("strategy") != "grid":
        return None
    probes = [ProbeResult.from_dict(p) for p in doc["probes"]]
    return api.AnalysisResult(ProbeResult.from_dict(doc["baseline"]), ProbeResult.from_dict(doc["recommended"]),
                              doc["speedup"], probes, doc["notes"], doc["budget"]["unexplored"], folder, doc)


def remeasure(path: Path, configs: dict[str, dict], workdir: Path) -> dict[str, tuple[list, list]]:
    """Each distinct configuration re-measured ROUNDS times, interleaved; pooled (items, step_s) per label."""
    pooled = {label: ([], []) for label in configs}
    for _ in range(ROUNDS):
        for label, settings in configs.items():
            _, result = api.probe(path, settings, device="cpu", protocol=REMEASURE, workdir=workdir)
            if not result.ok:
                raise RuntimeError(f"{path.name}: re-measuring {label} failed: {result.status.value} {result.error}")
            pooled[label][0].extend(result.items)
            pooled[label][1].extend(result.step_s)
    return pooled


def bench(name: str, out: Path) -> dict:
    path = ROOT / "fixtures" / name
    stem = path.stem
    api.inspect(path, "cpu", out / stem / "warm")  # start the probe zygote first, so neither strategy pays for it
    grid = saved_grid(out / stem / "grid")
    if grid is None:
        print(f"\n== {name}: grid", flush=True)
        grid = api.analyze(path, out=out / stem / "grid", device="cpu", budget=None, protocol=PROTOCOL,
                           strategy="grid")
    else:
        print(f"\n== {name}: grid already measured in {out / stem / 'grid'}", flush=True)
    runs = []
    for i in (1, 2):
        print(f"== {name}: adaptive planner, run {i}", flush=True)
        runs.append(api.analyze(path, out=out / stem / f"adaptive{i}", device="cpu", budget=PLANNER_BUDGET,
                                protocol=PROTOCOL))
    base = grid.baseline.settings
    grid_best = fastest(grid.probes)
    configs = {"grid": grid_best.settings, "planner": runs[0].recommended.settings}
    if runs[1].recommended.settings != runs[0].recommended.settings:
        configs["planner2"] = runs[1].recommended.settings
    print(f"== {name}: re-measuring {', '.join(configs)} interleaved, {ROUNDS} rounds", flush=True)
    pooled = remeasure(path, configs, out / stem / "remeasure")

    def ratio(a: str, b: str) -> tuple[float, float, float]:
        return stats.ratio_ci(*pooled[a], *pooled[b])

    planner_vs_grid = ratio("grid", "planner")
    repeat = ratio("planner", "planner2") if "planner2" in configs else None
    grid_s, planner_s = grid.document["budget"]["used_s"], runs[0].document["budget"]["used_s"]
    return {
        "fixture": stem,
        "grid_size": sum(1 for p in grid.probes if p.role == "grid") + 1,
        "grid_best": knobs.describe(grid_best.settings, base),
        "planner": knobs.describe(runs[0].recommended.settings, base),
        "planner_vs_grid": planner_vs_grid,
        "regret": 1 - planner_vs_grid[0],
        "planner_probes": sum(1 for p in runs[0].probes if p.wall_s > 0),
        "grid_probes": sum(1 for p in grid.probes if p.wall_s > 0),
        "planner_s": planner_s, "grid_s": grid_s, "cost": planner_s / grid_s,
        "repeat_same": repeat is None,
        "repeat": knobs.describe(runs[1].recommended.settings, base),
        "repeat_ratio": repeat,
    }


def table(rows: list[dict]) -> str:
    head = (f"{'fixture':<15} {'grid best':<38} {'planner':<38} {'planner/grid [95% CI]':<22} {'regret':>7} "
            f"{'probes P/G':>10} {'time P/G (s)':>13} {'cost':>6}  repeat run")
    lines = [head, "-" * len(head)]
    for r in rows:
        m, lo, hi = r["planner_vs_grid"]
        rep = "same settings" if r["repeat_same"] else (
            f"{r['repeat']}: {r['repeat_ratio'][0]:.3f} [{r['repeat_ratio'][1]:.3f}, {r['repeat_ratio'][2]:.3f}]")
        lines.append(f"{r['fixture']:<15} {r['grid_best']:<38} {r['planner']:<38} "
                     f"{m:.3f} [{lo:.3f}, {hi:.3f}]   {r['regret']:>6.1%} "
                     f"{r['planner_probes']:>4}/{r['grid_probes']:<5} {r['planner_s']:>6.0f}/{r['grid_s']:<6.0f} "
                     f"{r['cost']:>6.1%}  {rep}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixtures", nargs="*", default=FIXTURES)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "search_quality")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows_path = args.out / "rows.json"
    rows = []
    for name in args.fixtures:
        rows.append(bench(Path(name).name, args.out))
        rows_path.write_text(json.dumps(rows, indent=1))
        print(table(rows[-1:]), flush=True)
    print("\n" + table(rows))
    worst = max(r["regret"] for r in rows)
    print(f"\nworst regret {worst:.1%} (target <= 5%); worst cost {max(r['cost'] for r in rows):.1%} "
          f"(target <= 30%)")
    sys.exit(0)


if __name__ == "__main__":
    main()
