"""Can people trust the gate? False alarms without a change, and detection of a planted 15% slowdown.

Records one baseline of benchmarks/workloads/gate_slowdown.py, then runs the gate RUNS times on the unchanged
workload and RUNS times with TUNE_ADVISOR_SLOWDOWN=0.15 (every step ~15% slower), alternating the two so machine
drift during the benchmark hits both alike. Each gate run is a fresh set of child probes compared with the stored
baseline (the harder case: no interleaved reference). Prints every run and the totals; exits 1 when the targets
(at most 1 false alarm, at least 19 of 20 detected) are missed. About 10-15 minutes on 2 CPU cores.

    python benchmarks/gate_reliability.py [--runs 20] [--rounds 3] [--slowdown 0.15] [--check throughput:5%]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from tune_advisor import results
from tune_advisor.gate import DEFAULT_CHECKS, record_baseline, run_gate
from tune_advisor.probe.spec import Protocol

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "benchmarks" / "workloads" / "gate_slowdown.py"
ENV = "TUNE_ADVISOR_SLOWDOWN"
# Short rounds: enough steps for a stable rate on a ~20 ms step, capped so a noisy round cannot run long.
PROTOCOL = Protocol(warmup_steps=3, min_steps=20, min_time_s=1.0, max_steps=200, max_time_s=3.0)


def gate_once(baseline: Path, slowdown: float | None, rounds: int, checks: list[str]):
    if slowdown:
        os.environ[ENV] = str(slowdown)  # inherited by the probe children
    else:
        os.environ.pop(ENV, None)
    started = time.monotonic()
    result = run_gate(WORKLOAD, baseline=baseline, checks=checks, rounds=rounds, device="cpu")
    return result, time.monotonic() - started


def describe(result) -> str:
    parts = []
    for check in result.document["checks"]:
        ratio = check["figures"].get("ratio")
        if ratio:
            parts.append(f"{check['check']} {check['status']:<4} ratio {ratio['median']:.3f} "
                         f"[{ratio.get('ci_low_widened', ratio['ci_low']):.3f}, "
                         f"{ratio.get('ci_high_widened', ratio['ci_high']):.3f}]")
        elif "worst_case" in check["figures"]:  # peak memory: median ratio and smallest/largest round ratio
            parts.append(f"{check['check']} {check['status']:<4} ratio {check['figures']['median']:.3f} "
                         f"(worst case {check['figures']['worst_case']:.3f})")
        else:
            parts.append(f"{check['check']} {check['status']}")
    return "; ".join(parts)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slowdown", type=float, default=0.15)
    parser.add_argument("--check", action="append", default=None, help=f"default: {', '.join(DEFAULT_CHECKS)}")
    parser.add_argument("--baseline", type=Path, default=Path("/tmp/tune-advisor-gate-reliability/baseline.json"))
    args = parser.parse_args(argv)
    checks = args.check or list(DEFAULT_CHECKS)

    started = time.monotonic()
    os.environ.pop(ENV, None)
    document = record_baseline(WORKLOAD, rounds=args.rounds, device="cpu", protocol=PROTOCOL,
                               command=["benchmarks/gate_reliability.py"])
    args.baseline.parent.mkdir(parents=True, exist_ok=True)
    results.write_atomic(args.baseline, document)
    tp = document["summary"]["throughput"]
    print(f"baseline: {tp['median']:.1f} {tp['unit']}, rounds {[round(x, 1) for x in tp['rounds']]}, "
          f"run-to-run spread {tp['spread']:.1%} ({time.monotonic() - started:.0f} s)", flush=True)

    outcomes = {"unchanged": [], "slowed": []}
    for i in range(args.runs):
        for label, slowdown in (("unchanged", None), ("slowed", args.slowdown)):
            result, took = gate_once(args.baseline, slowdown, args.rounds, checks)
            outcomes[label].append(result)
            print(f"run {i + 1:>2} {label:<9} exit {result.exit_code}  {describe(result)}  ({took:.0f} s)",
                  flush=True)
    os.environ.pop(ENV, None)

    false_alarms = sum(r.exit_code != 0 for r in outcomes["unchanged"])
    tripped = [c["check"] for r in outcomes["unchanged"] for c in r.document["checks"] if c["status"] != "pass"]
    detected = sum(r.exit_code == 1 for r in outcomes["slowed"])

    def median_ratio(label: str) -> float:
        ratios = [c["figures"]["ratio"]["median"] for r in outcomes[label] for c in r.document["checks"]
                  if c["check"].startswith("throughput:") and c["figures"].get("ratio")]
        return statistics.median(ratios) if ratios else float("nan")

    print(f"\ngate reliability on {WORKLOAD.name}: {args.runs} runs each, {args.rounds} rounds per side, "
          f"checks {', '.join(checks)}, stored baseline")
    print(f"  no change:          {false_alarms:>2} false alarm(s) of {args.runs}   (target <= 1)   "
          f"median throughput ratio {median_ratio('unchanged'):.3f}")
    if tripped:
        print(f"    checks not passing without a change: {', '.join(tripped)}")
    print(f"  {args.slowdown:.0%} slower steps:  {detected:>2} detected of {args.runs}       (target >= "
          f"{args.runs - 1})  median throughput ratio {median_ratio('slowed'):.3f}")
    print(f"  total time {(time.monotonic() - started) / 60:.1f} min")
    return 0 if false_alarms <= 1 and detected >= args.runs - 1 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
