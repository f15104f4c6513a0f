"""How long should each side of a confirmation round in turn measure? Rounds against their spread.

A confirmation whose two settings cannot share a lockstep pair (different loaders, steps far apart) measures them
one after the other, round after round, and its CI is Student's t over the rounds. Longer windows smooth each
side's figure; more rounds shrink t. For one fixture and one candidate, ROUNDS rounds in turn per window cap,
the caps interleaved round by round (so both see the same stretches of the machine) and who goes first
alternating. Prints each round, then per cap: the geometric mean ratio, the log sd of the rounds' ratios, the mean
wall time of a round, and sd² x wall (the spread per second spent: equal values mean the cap does not matter, and
shorter rounds buy more of them). Prints the CPU model and flags first. About 3-4 minutes for the default case
on 2 cores.

    python benchmarks/confirm_rounds.py [--rounds 8] [--caps 4 8] [CASE]   (cases: augment_cpu, io_bound)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from tune_advisor import environment, knobs
from tune_advisor.planner.compare import window_rate
from tune_advisor.probe.runner import run_probe
from tune_advisor.probe.spec import ProbeSpec, Protocol

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # case -> (fixture, the candidate's changes over its BASELINE: what its analyses recommend)
    "augment_cpu": ("augment_cpu", {"batch_size": 128, "num_workers": 2}),
    "io_bound": ("io_bound", {"num_workers": 16}),
}
# search_quality's protocol (the planner runs it measures), whose confirmation windows ran to 8 s
PROTOCOL = Protocol(warmup_steps=2, min_steps=8, min_time_s=0.5, max_time_s=8.0)


def fixture_baseline(name: str) -> dict:
    namespace: dict = {}
    exec(compile((ROOT / "fixtures" / f"{name}.py").read_text(), name, "exec"), namespace)
    return knobs.full_settings(namespace["BASELINE"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", nargs="?", default="augment_cpu", choices=sorted(CASES))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--caps", type=float, nargs="+", default=[4.0, 8.0], help="window caps (max_time_s), seconds")
    args = ap.parse_args()
    print(f"CPU: {environment.cpu_model()}; flags: {', '.join(environment.cpu_flags()) or 'none of note'}")
    fixture, change = CASES[args.case]
    base = fixture_baseline(fixture)
    cand = {**base, **change}
    workload = str(ROOT / "fixtures" / f"{fixture}.py")
    print(f"{args.case}: {knobs.describe(cand, base)} against the baseline, {args.rounds} rounds in turn per cap")
    rows: dict[float, list[tuple[float, float, float]]] = {cap: [] for cap in args.caps}
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for i in range(args.rounds):
            for cap in (args.caps if i % 2 == 0 else list(reversed(args.caps))):
                protocol = replace(PROTOCOL, max_time_s=cap, min_time_s=min(PROTOCOL.min_time_s, cap))
                order = [("baseline", base), ("candidate", cand)][:: 1 if i % 2 == 0 else -1]
                rates, started = {}, time.monotonic()
                for side, settings in order:
                    n += 1
                    spec = ProbeSpec(id=f"r{n:03d}", workload=workload, settings=settings, device="cpu",
                                     protocol=protocol)
                    result = run_probe(spec, Path(tmp), role=side)
                    if not result.ok:
                        print(f"{side} failed: {result.status.value} {result.error}", file=sys.stderr)
                        return 1
                    rates[side] = (window_rate(result), sum(result.step_s))
                wall = time.monotonic() - started
                (rb, wb), (rc, wc) = rates["baseline"], rates["candidate"]
                rows[cap].append((rb, rc, wall))
                print(f"  round {i + 1} cap {cap:g} s: baseline {rb:,.0f}/s ({wb:.1f} s window), candidate "
                      f"{rc:,.0f}/s ({wc:.1f} s), ratio {rc / rb:.3f}, round {wall:.1f} s", flush=True)
    print(f"{'cap':>6} {'ratio':>7} {'log sd':>7} {'round s':>8} {'sd² x s':>8}")
    for cap, r in rows.items():
        logs = [math.log(c / b) for b, c, _ in r]
        sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
        wall = statistics.mean(w for *_, w in r)
        print(f"{cap:>6g} {math.exp(statistics.mean(logs)):>7.3f} {sd:>7.3f} {wall:>8.1f} {sd * sd * wall:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
