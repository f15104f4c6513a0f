"""Can people trust the gate? False alarms without a change, and detection of a planted 15% slowdown.

Runs the gate RUNS times on the unchanged workload (benchmarks/workloads/gate_slowdown.py) and RUNS times with
TUNE_ADVISOR_SLOWDOWN=0.15 (every step ~15% slower), alternating the two. Two modes:

- interleaved (default; `gate --against REF`, what docs/ci-gating.md recommends for CI): the workload is committed
  to a scratch git repository as the reference, in a version that ignores the variable (the code "before the
  change"); each gate run measures that ref and the working copy in alternating rounds in the same job.
- stored (`gate --baseline FILE`): one baseline is recorded first, and each gate run is compared with it. On a
  machine whose speed drifts between jobs this is the harder case; the recorded run-to-run spread widens the CI.

Beside false alarms and detections it prints the A/A coverage (how many of the unchanged runs' 95% intervals
hold 1.00; target >= 90%) and, in interleaved mode, a side swap: --swap-runs runs with the slowdown in the
reference instead of the working copy, whose ratios should be the inverse of the slowed runs' (A/B against B/A).
Prints the CPU model and flags first. Exits 1 when a target (at most 1 false alarm, at least 19 of 20 detected,
A/A coverage, the swap's agreement) is missed. Interleaved (each round a lockstep pair) with 3 rounds and 20 runs
each: about 20 minutes on 2 CPU cores.

    python benchmarks/gate_reliability.py [--mode interleaved|stored] [--runs 20] [--rounds 3] [--slowdown 0.15]
                                          [--swap-runs 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tune_advisor import environment, results
from tune_advisor.gate import DEFAULT_CHECKS, record_baseline, run_gate
from tune_advisor.probe.spec import Protocol

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "benchmarks" / "workloads" / "gate_slowdown.py"
ENV = "TUNE_ADVISOR_SLOWDOWN"
# Short rounds: enough steps for a stable rate on a ~20 ms step, capped so a noisy round cannot run long.
PROTOCOL = Protocol(warmup_steps=3, min_steps=20, min_time_s=1.0, max_steps=200, max_time_s=3.0)


def scratch_repo(swapped: bool = False) -> Path:
    """A git repository whose HEAD holds the workload "before the change" (blind to ENV); returns the working copy,
    which reads ENV (the change, when ENV is set). `swapped`: the other way round, HEAD reads ENV and the working
    copy is blind to it (the slowdown sits in the reference)."""
    repo = Path(tempfile.mkdtemp(prefix="gate-reliability-repo-"))
    working = repo / WORKLOAD.name
    text = WORKLOAD.read_text()
    assert text.count(f'"{ENV}"') == 1, "the workload reads its slowdown from one place"
    blind = text.replace(f'"{ENV}"', f'"{ENV}_NOT_HERE"')
    working.write_text(text if swapped else blind)
    for args in (["init", "-q"], ["add", WORKLOAD.name],
                 ["-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-q", "-m", "ref"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    working.write_text(blind if swapped else text)
    return working


def gate_once(reference: dict, slowdown: float | None, rounds: int, checks: list[str], workload: Path):
    if slowdown:
        os.environ[ENV] = str(slowdown)  # inherited by the probe children
    else:
        os.environ.pop(ENV, None)
    started = time.monotonic()
    result = run_gate(workload, checks=checks, rounds=rounds, device="cpu", protocol=PROTOCOL, **reference)
    return result, time.monotonic() - started


def throughput_ratio(result) -> dict | None:
    """The throughput check's ratio figures (median, ci_low, ci_high and, stored, the widened bounds)."""
    return next((c["figures"]["ratio"] for c in result.document["checks"]
                 if c["check"].startswith("throughput:") and c["figures"].get("ratio")), None)


def bounds(ratio: dict) -> tuple[float, float]:
    """The interval the check judged by: widened by the run-to-run allowance in stored mode."""
    return ratio.get("ci_low_widened", ratio["ci_low"]), ratio.get("ci_high_widened", ratio["ci_high"])


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
    # rounds beyond --rounds: a check was undecided (beyond its allowed change, not significantly)
    return "; ".join(parts) + f"; {result.document.get('rounds_measured', '?')} rounds"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("interleaved", "stored"), default="interleaved")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)  # the gate's default
    parser.add_argument("--slowdown", type=float, default=0.15)
    parser.add_argument("--check", action="append", default=None,  # argparse reads % in help: doubled
                        help=f"default: {', '.join(DEFAULT_CHECKS)}".replace("%", "%%"))
    parser.add_argument("--baseline", type=Path, default=Path("/tmp/tune-advisor-gate-reliability/baseline.json"))
    parser.add_argument("--save", type=Path, default=None, help="write every gate run's gate.json into this folder")
    parser.add_argument("--swap-runs", type=int, default=5,
                        help="interleaved: runs with the slowdown in the reference instead (A/B against B/A)")
    args = parser.parse_args(argv)
    checks = args.check or list(DEFAULT_CHECKS)

    print(environment.machine_line())
    started = time.monotonic()
    os.environ.pop(ENV, None)
    if args.mode == "stored":
        workload = WORKLOAD
        document = record_baseline(WORKLOAD, rounds=args.rounds, device="cpu", protocol=PROTOCOL,
                                   command=["benchmarks/gate_reliability.py"])
        args.baseline.parent.mkdir(parents=True, exist_ok=True)
        results.write_atomic(args.baseline, document)
        tp = document["summary"]["throughput"]
        print(f"baseline: {tp['median']:.1f} {tp['unit']}, rounds {[round(x, 1) for x in tp['rounds']]}, "
              f"run-to-run spread {tp['spread']:.1%} ({time.monotonic() - started:.0f} s)", flush=True)
        reference = {"baseline": args.baseline}
    else:
        workload = scratch_repo()
        reference = {"against": "HEAD"}
        print(f"reference: {workload.parent} at HEAD (ignores {ENV}); candidate: its working copy", flush=True)

    outcomes = {"unchanged": [], "slowed": [], "swapped": []}

    def once(label: str, slowdown: float | None, path: Path, i: int) -> None:
        result, took = gate_once(reference, slowdown, args.rounds, checks, path)
        outcomes[label].append(result)
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            results.write_atomic(args.save / f"run{i + 1:02d}-{label}.json", result.document)
        print(f"run {i + 1:>2} {label:<9} exit {result.exit_code}  {describe(result)}  ({took:.0f} s)", flush=True)

    for i in range(args.runs):
        for label, slowdown in (("unchanged", None), ("slowed", args.slowdown)):
            once(label, slowdown, workload, i)
    swap_runs = args.swap_runs if args.mode == "interleaved" else 0
    if swap_runs:
        swapped = scratch_repo(swapped=True)
        print(f"side swap: {swapped.parent} at HEAD reads {ENV}; its working copy ignores it", flush=True)
        for i in range(swap_runs):
            once("swapped", args.slowdown, swapped, i)
        shutil.rmtree(swapped.parent, ignore_errors=True)
    os.environ.pop(ENV, None)

    false_alarms = sum(r.exit_code != 0 for r in outcomes["unchanged"])
    tripped = [c["check"] for r in outcomes["unchanged"] for c in r.document["checks"] if c["status"] != "pass"]
    detected = sum(r.exit_code == 1 for r in outcomes["slowed"])
    aa = [throughput_ratio(r) for r in outcomes["unchanged"]]
    aa = [bounds(r) for r in aa if r and r["ci_low"] is not None and r["ci_high"] is not None]
    covering = sum(low <= 1.0 <= high for low, high in aa)
    coverage = covering / len(aa) if aa else float("nan")

    def median_ratio(label: str) -> float:
        ratios = [r["median"] for r in map(throughput_ratio, outcomes[label]) if r and r["median"] is not None]
        return statistics.median(ratios) if ratios else float("nan")

    print(f"\ngate reliability on {WORKLOAD.name}: {args.runs} runs each, {args.rounds} rounds per side, "
          f"checks {', '.join(checks)}, {args.mode} reference")
    print(f"  no change:          {false_alarms:>2} false alarm(s) of {args.runs}   (target <= 1)   "
          f"median throughput ratio {median_ratio('unchanged'):.3f}")
    if tripped:
        print(f"    checks not passing without a change: {', '.join(tripped)}")
    print(f"  A/A coverage:       {covering:>2} of {len(aa)} throughput intervals hold 1.00 ({coverage:.0%}; "
          "target >= 90%)")
    print(f"  {args.slowdown:.0%} slower steps:  {detected:>2} detected of {args.runs}       (target >= "
          f"{args.runs - 1})  median throughput ratio {median_ratio('slowed'):.3f}")
    swap_ok = True
    if swap_runs:
        slowed, swapped_ratio = median_ratio("slowed"), median_ratio("swapped")
        product = slowed * swapped_ratio
        swap_ok = abs(product - 1) <= 0.03
        print(f"  side swap:          slowdown in the working copy {slowed:.3f}x, in the reference "
              f"{swapped_ratio:.3f}x (inverse {1 / swapped_ratio:.3f}x); product {product:.3f} (target 1.00 +- 0.03)")
    print(f"  total time {(time.monotonic() - started) / 60:.1f} min")
    if args.mode == "interleaved":
        shutil.rmtree(workload.parent, ignore_errors=True)
    met = false_alarms <= 1 and detected >= args.runs - 1 and coverage >= 0.9 and swap_ok
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
