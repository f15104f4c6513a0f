"""How does the recommendation's quality grow with --budget? (issue 21: where to set the default budget.)

For each fixture, `analyze` as a user runs it (default protocol, default knobs) at each budget of --budgets in
ascending order. A run that ended on its own (nothing in `budget.unexplored` for want of time) ran its whole plan,
so larger budgets are not run for that fixture: the planner only stops early for the budget, it never explores
more because more is left. The reference is the last run (the largest budget measured). Each other run's
recommendation is re-measured against the reference's (search_quality.remeasure: 4 lockstep rounds where their
loaders match, 8 rounds in turn otherwise); quality = that ratio, regret = 1 - quality. Prints per run the wall
time used, whether it ended on its own, the recommendation and its reported speedup, and the regret; then per
budget the worst and median regret over the fixtures. Prints the CPU model and flags first.

    python benchmarks/budget_curve.py [FIXTURE.py ...] [--budgets 1m,2m,3m,5m,10m,15m] [--out DIR]

Finished runs found in DIR are reused (an interrupted benchmark goes on where it stopped).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from search_quality import remeasure, saved_run  # this folder is on sys.path when run as a script

from tune_advisor import api, environment, knobs
from tune_advisor.planner.budget import more_time

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ["tiny_batch_mlp.py", "cnn.py", "io_bound.py", "lstm_collate.py", "augment_cpu.py", "raw_sensor_mlp.py",
            "lightning_module.py", "hf_transformer.py", "varlen_transformer.py", "hf_trainer.py"]


def cut_by_budget(run: api.Analysis) -> list[str]:
    """The settings the run left for want of time (empty: it ran its whole plan)."""
    more = more_time(run.unexplored, run.document["budget"]["limit_s"])
    return more.cut if more else []


def speedup_text(run: api.Analysis) -> str:
    s = run.speedup
    if not s:
        return "1.00x (kept the baseline)"
    return f"{s['median']:.2f}x [{s['ci_low']:.2f}, {s['ci_high']:.2f}]"


def fixture_curve(name: str, budgets: list[str], out: Path) -> list[dict]:
    path = ROOT / "fixtures" / name
    stem = path.stem
    api.inspect_workload(path, "cpu", out / stem / "warm")  # start the probe zygote before the first timed run
    runs: list[tuple[str, api.Analysis]] = []
    for budget in budgets:
        folder = out / stem / f"budget-{budget}"
        run = saved_run(folder, "adaptive")
        if run is None:
            print(f"== {stem}: --budget {budget}", flush=True)
            run = api.analyze(path, api.AnalyzeOptions(out=folder, device="cpu", budget=budget))
        runs.append((budget, run))
        cut = cut_by_budget(run)
        print(f"   used {run.document['budget']['used_s']:.0f} s, {'cut: ' + '; '.join(cut) if cut else 'ended on its own'}"
              f"; {knobs.describe(run.recommended.settings, run.baseline.settings)}, {speedup_text(run)}", flush=True)
        if not cut:
            break
    ref_budget, ref = runs[-1]
    rows = []
    for budget, run in runs:
        if run is ref:
            vs = {"median": 1.0, "low": 1.0, "high": 1.0, "rounds": [], "how": "the reference"}
        else:
            print(f"== {stem}: re-measuring --budget {budget}'s recommendation against {ref_budget}'s", flush=True)
            vs = remeasure(path, ref.recommended.settings, run.recommended.settings, out / stem / "remeasure",
                           [*ref.probes, *run.probes])
        rows.append({"fixture": stem, "budget": budget, "reference": ref_budget,
                     "used_s": run.document["budget"]["used_s"], "cut": cut_by_budget(run),
                     "recommended": knobs.describe(run.recommended.settings, run.baseline.settings),
                     "speedup": speedup_text(run), "vs_reference": vs, "regret": 1 - vs["median"]})
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'fixture':<19} {'budget':>6} {'used (s)':>8} {'ended':<9} {'recommended':<44} {'reported':<22} "
            f"{'vs reference [range]':<26} {'regret':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        v = r["vs_reference"]
        how = "" if not v["rounds"] else f" {v['how']}"
        lines.append(f"{r['fixture']:<19} {r['budget']:>6} {r['used_s']:>8.0f} {'budget' if r['cut'] else 'own':<9} "
                     f"{r['recommended'][:44]:<44} {r['speedup']:<22} "
                     f"{v['median']:.3f} [{v['low']:.3f}, {v['high']:.3f}]{how:<10} {r['regret']:>6.1%}")
    return "\n".join(lines)


def by_budget(rows: list[dict], budgets: list[str]) -> str:
    """Per budget: each fixture's regret there; a fixture whose plan ended on its own at a smaller budget counts
    with that run's regret (a larger budget runs the same plan)."""
    fixtures = sorted({r["fixture"] for r in rows})
    lines = [f"{'budget':>6} {'worst regret':>12} {'median':>7} {'ended on their own':>19}"]
    for i, budget in enumerate(budgets):
        regrets, own = [], 0
        for f in fixtures:
            mine = [r for r in rows if r["fixture"] == f and budgets.index(r["budget"]) <= i]
            if mine:
                regrets.append(mine[-1]["regret"])
                own += not mine[-1]["cut"]
        if regrets:
            lines.append(f"{budget:>6} {max(regrets):>12.1%} {statistics.median(regrets):>7.1%} "
                         f"{own:>12} of {len(regrets)}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixtures", nargs="*", default=FIXTURES)
    parser.add_argument("--budgets", default="1m,2m,3m,5m,10m,15m")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "budget_curve")
    args = parser.parse_args()
    budgets = [b for b in args.budgets.split(",") if b]
    print(environment.machine_line(), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for name in args.fixtures:
        rows += fixture_curve(Path(name).name, budgets, args.out)
        (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    print("\n" + table(rows) + "\n\n" + by_budget(rows, budgets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
