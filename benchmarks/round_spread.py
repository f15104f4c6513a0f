"""How far do a confirmation's rounds spread, one from the next? (the prior behind analysis/stats.py's ROUND_SPREAD)

Reads every results.json under the folders given (budget-curve and search-quality runs: any analyze output), keeps
one copy of each (identical files once), and for each confirmation of two or more finished rounds takes the log of
each round's ratio (recommended/baseline over its measured window, as the confirmation reckons it). Prints, per kind
of round (step-by-step lockstep, lockstep in timed turns, in turn) and over all of them: how many confirmations, the
degrees of freedom, the pooled log sd (each confirmation's own mean removed: `stats.pooled_log_sd`), and the median
and largest of the confirmations' own sds. Then a check of the prior against the rounds: for each confirmation of at
least FIRST + 2 rounds, the interval the confirmation would state from its first FIRST rounds with a prior of each
size (Student's t over the spread pooled with the prior as ROUND_SPREAD_DF degrees of freedom), and whether it holds
the mean of the rounds after them: a prediction, so a calibrated 95% CI holds it less than 95% of the time.

    python benchmarks/round_spread.py DIR [DIR ...] [--fixtures-only] [--priors 0.06,0.08,0.11,0.15] [--exploration]

`--exploration`: the search's duels in turn instead (each comparison's rounds one record), the spread a duel in turn
pools with EXPLORATION_SPREAD (planner/compare.in_turn_drift). Last, for either kind, each round against the
prediction interval of its record's other rounds at each prior: the prior is wide enough where 95% or more hold.

`--fixtures-only`: only runs of the shipped fixtures (fixtures/*.py) outside pytest's folders (the test suite's
workloads are built to fail or hang, and run on a machine busy with the tests). Prints the CPU model and flags first:
the rounds were measured on the machines that wrote the files, which each results.json names.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from tune_advisor import environment
from tune_advisor.analysis import stats
from tune_advisor.analysis.stats import ROUND_SPREAD_DF

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = {p.stem for p in (ROOT / "fixtures").glob("*.py")}
TIMED_TURN_STEPS = 16  # a matched turn holds at most this many steps (probe/lockstep.py); a timed turn more


def _rate(probe: dict) -> float:
    steps = (probe.get("step_time_s") or {}).get("samples") or []
    items = (probe.get("raw") or {}).get("items") or []
    return sum(items) / sum(steps) if steps and sum(steps) > 0 else float("nan")


def _kind(a: dict, b: dict) -> str:
    sides = [p.get("extra", {}).get("lockstep") for p in (a, b)]
    if not all(sides):
        return "in turn"
    return "timed turns" if max(max(s.get("turns") or [1]) for s in sides) > TIMED_TURN_STEPS else "step by step"


def _documents(folders: list[Path], fixtures_only: bool):
    """(path, probes, workload, cpu) of each results.json under `folders`, one copy of each."""
    seen = set()
    for path in sorted(f for folder in folders for f in folder.rglob("results.json")):
        try:
            raw = path.read_bytes()
            doc = json.loads(raw)
        except (OSError, ValueError):
            continue
        digest = hashlib.sha256(raw).hexdigest()
        probes = doc.get("probes") if isinstance(doc, dict) else None
        if digest in seen or not isinstance(probes, list) or not all(isinstance(p, dict) for p in probes):
            continue
        seen.add(digest)
        workload = Path(str((doc.get("workload") or {}).get("path", ""))).stem
        if fixtures_only and (workload not in FIXTURES or "pytest-of-" in str(path)):
            continue
        yield path, probes, workload, (doc.get("environment") or {}).get("cpu_model")


def confirmations(folders: list[Path], fixtures_only: bool) -> list[dict]:
    """One record per confirmation of two or more finished rounds: {kind, logs, workload, file, cpu}."""
    found = []
    for path, probes, workload, cpu in _documents(folders, fixtures_only):
        sides = {role: [p for p in probes if p.get("role") == role and p.get("status") == "ok" and _rate(p) > 0]
                 for role in ("confirm:baseline", "confirm:recommended")}
        pairs = list(zip(sides["confirm:baseline"], sides["confirm:recommended"]))
        kinds = {_kind(a, b) for a, b in pairs}
        if len(pairs) < 2 or len(kinds) != 1:
            continue
        found.append({"kind": kinds.pop(), "logs": [math.log(_rate(b) / _rate(a)) for a, b in pairs],
                      "workload": workload, "file": str(path), "cpu": cpu})
    return found


def exploration_duels(folders: list[Path], fixtures_only: bool) -> list[dict]:
    """One record per comparison the search dueled in turn two or more times (consecutive `recheck` probes of two
    settings, neither in lockstep), its rounds' log ratios in one orientation: {kind, logs, workload, file, cpu}.
    Their probes fork from the search's long-lived zygotes, a confirmation's from new ones."""
    found = []
    for path, probes, workload, cpu in _documents(folders, fixtures_only):
        ok = [p for p in probes if p.get("status") == "ok" and _rate(p) > 0]
        comparisons = defaultdict(list)
        i = 0
        while i + 1 < len(ok):
            a, b = ok[i], ok[i + 1]
            if (a.get("role") == b.get("role") == "recheck" and a.get("settings") != b.get("settings")
                    and _kind(a, b) == "in turn"):
                x, y = sorted((a, b), key=lambda p: json.dumps(p.get("settings"), sort_keys=True))
                key = (json.dumps(x.get("settings"), sort_keys=True), json.dumps(y.get("settings"), sort_keys=True))
                comparisons[key].append(math.log(_rate(y) / _rate(x)))
                i += 2
            else:
                i += 1
        found += [{"kind": "exploration in turn", "logs": logs, "workload": workload, "file": str(path), "cpu": cpu}
                  for logs in comparisons.values() if len(logs) >= 2]
    return found


def summary(records: list[dict]) -> dict:
    sds = sorted(float(np.std(r["logs"], ddof=1)) for r in records)
    sd, df = stats.pooled_log_sd([np.exp(r["logs"]) for r in records])
    return {"confirmations": len(records), "df": df, "pooled_sd": sd, "median_sd": sds[len(sds) // 2],
            "largest_sd": sds[-1]}


def prior_check(records: list[dict], prior: float, first: int) -> tuple[int, int, float]:
    """(held, checked, median half-width): the first `first` rounds' interval with `prior` against the mean of the
    rounds after them."""
    held, checked, halves = 0, 0, []
    for r in records:
        logs = r["logs"]
        if len(logs) < first + 2:
            continue
        head, rest = np.array(logs[:first]), np.array(logs[first:])
        sd, df = stats.pooled_log_sd([np.exp(head)], (prior, ROUND_SPREAD_DF))
        half = stats.t95(df) * sd / math.sqrt(first)
        held += abs(rest.mean() - head.mean()) <= half
        checked += 1
        halves.append(half)
    return held, checked, float(np.median(halves)) if halves else float("nan")


def leave_one_out(records: list[dict], prior: float) -> tuple[int, int]:
    """(held, checked): each round of each record against the 95% prediction interval of one more round from the
    record's other rounds, their spread pooled with `prior` as ROUND_SPREAD_DF degrees of freedom (Student's t):
    whether the spread the planner would use is as wide as the rounds really spread."""
    held = checked = 0
    for r in records:
        logs = np.array(r["logs"])
        for i in range(logs.size):
            rest = np.delete(logs, i)
            sd, df = stats.pooled_log_sd([np.exp(rest)], (prior, ROUND_SPREAD_DF))
            held += abs(logs[i] - rest.mean()) <= stats.t95(df) * sd * math.sqrt(1 + 1 / rest.size)
            checked += 1
    return held, checked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--fixtures-only", action="store_true")
    parser.add_argument("--priors", default="0.06,0.08,0.11,0.15")
    parser.add_argument("--exploration", action="store_true",
                        help="the search's duels in turn, not the confirmations' rounds")
    args = parser.parse_args(argv)
    env = environment.collect("cpu")
    print(f"this machine: {env.get('cpu_model')} ({', '.join(env.get('cpu_flags') or [])}), "
          f"{env.get('cpu_count')} cores")
    records = (exploration_duels if args.exploration else confirmations)(args.folders, args.fixtures_only)
    if not records:
        print("no comparison of two or more rounds found")
        return 1
    print("measured on: " + ", ".join(sorted({str(r["cpu"]) for r in records})))
    groups = defaultdict(list)
    for r in records:
        groups[r["kind"]].append(r)
    what = "comparisons" if args.exploration else "confirmations"
    print(f"{'rounds':20} {what:>13} {'df':>5} {'pooled sd':>9} {'median sd':>9} {'largest sd':>10}")
    for kind, group in [*sorted(groups.items()), ("all", records)]:
        s = summary(group)
        print(f"{kind:20} {s['confirmations']:>13} {s['df']:>5} {s['pooled_sd']:>9.3f} {s['median_sd']:>9.3f} "
              f"{s['largest_sd']:>10.3f}")
    for cpu in sorted({str(r["cpu"]) for r in records}):
        s = summary([r for r in records if str(r["cpu"]) == cpu])
        print(f"{'on ' + cpu:30} {s['confirmations']:>3} {what}, {s['df']:>3} df, pooled sd {s['pooled_sd']:.3f}")
    if args.exploration:
        for workload in sorted({r["workload"] for r in records}):
            s = summary([r for r in records if r["workload"] == workload])
            print(f"{workload:30} {s['confirmations']:>3} {what}, {s['df']:>3} df, pooled sd {s['pooled_sd']:.3f}")
    print(f"\nthe first rounds' interval (prior as {ROUND_SPREAD_DF} degrees of freedom) against the mean of the "
          "rounds after them:")
    for prior in (float(p) for p in args.priors.split(",")):
        cells = []
        for first in (2, 3):
            held, checked, half = prior_check(records, prior, first)
            cells.append(f"from {first} rounds: held {held}/{checked}, median half-width {half:.3f}")
        print(f"prior {prior:.2f}: " + "; ".join(cells))
    print("\neach round against the 95% prediction interval from its comparison's other rounds (spread pooled with "
          "the prior):")
    for prior in (float(p) for p in args.priors.split(",")):
        held, checked = leave_one_out(records, prior)
        print(f"prior {prior:.2f}: held {held}/{checked} ({held / checked:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
