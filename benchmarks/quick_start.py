"""The README's quick start, run as a new user runs it, and its report checked against itself (issue 65).

`tune-advisor analyze fixtures/io_bound.py --budget 2m` (the README's first command), `--runs` times, each into a
fresh folder. For each run: the recommendation, its speedup, what TA101 and TA102 say, and every contradiction:
`tune_advisor.consistency.contradictions` plus a finding's code against the recommendation (a finding that
advises on num_workers or batch_size, or advises nothing, spells out the recommendation's values), and TA101's
figure for the recommended workers against the headline's where the recommendation is its loader workers. One
2-core quick start had TA101 quote 32 workers at 5.33x beside a headline of 19.66x for 32 workers with persistent
workers, and TA102 advise 16 workers. Exit 1 when any run contradicts itself.

    python benchmarks/quick_start.py [--runs 1] [--budget 2m]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tune_advisor import environment, knobs
from tune_advisor.consistency import contradictions

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "fixtures" / "io_bound.py"
WORKER_KNOBS = ("num_workers", *knobs.LOADER_KNOBS)


def two_figures(document: dict) -> list[str]:
    """TA101 quoting another figure for the recommended workers than the headline, where the recommendation
    changes only the loader workers and their worker knobs."""
    rec, base = document["recommended"]["settings"], document["baseline"]["settings"]
    ta101 = next((f for f in document.get("findings") or [] if f["code"] == "TA101"), None)
    speed, gain = (document.get("speedup") or {}).get("median"), ((ta101 or {}).get("gain") or {}).get("speedup")
    if ta101 is None or not speed or not isinstance(gain, dict) or rec["num_workers"] == base["num_workers"] \
            or any(rec[k] != base[k] for k in rec if k not in WORKER_KNOBS):
        return []
    return [] if abs(gain["median"] / speed - 1) < 0.01 else [
        f"TA101 quotes {gain['median']:.2f}x for the recommended workers, the headline {speed:.2f}x"]


def run(budget: str, out: Path) -> dict:
    subprocess.run(["tune-advisor", "analyze", str(WORKLOAD), "--budget", budget, "-o", str(out), "--quiet"],
                   check=True, cwd=ROOT)
    return json.loads((out / "results.json").read_text())


def report(number: int, doc: dict) -> bool:
    """Print what run `number` recommends and says of its workers, and its contradictions; True if any."""
    rec, speedup = doc["recommended"]["settings"], (doc.get("speedup") or {}).get("median")
    stated = f"{speedup:.2f}x" if speedup else "no speedup stated: " + "; ".join(doc.get("notes") or [])
    print(f"run {number}: recommends {knobs.brief(rec)}, {stated}")
    for f in doc.get("findings") or []:
        if f["code"] in ("TA101", "TA102", "TA103"):
            print(f"  {f['code']}: {f['message']}")
    problems = contradictions(doc) + two_figures(doc)
    print("\n".join(f"  CONTRADICTION: {p}" for p in problems) or "  agrees with itself", flush=True)
    return bool(problems)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--budget", default="2m")
    parser.add_argument("--out", type=Path, help="keep each run's report in OUT/run<N> (default: a scratch folder)")
    args = parser.parse_args()
    print(f"{environment.machine_line()}\n", flush=True)
    bad = 0
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(args.runs):
            doc = run(args.budget, (args.out or Path(scratch)) / f"run{i + 1}")
            bad += report(i + 1, doc)
    print(f"\n{args.runs - bad} of {args.runs} quick starts agree with themselves")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
