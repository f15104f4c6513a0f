"""Can people trust the gate? False alarms without a change, and detection of a planted 15% slowdown.

Runs the gate RUNS times on the unchanged workload (benchmarks/workloads/gate_slowdown.py) and RUNS times with
TUNE_ADVISOR_SLOWDOWN=0.15 (every step ~15% slower), alternating the two. Two modes:

- interleaved (default; `gate --against REF`, what docs/ci-gating.md recommends for CI): the workload is committed
  to a scratch git repository as the reference, in a version that ignores the variable (the code "before the
  change"); each gate run measures that ref and the working copy in alternating rounds in the same job.
- stored (`gate --baseline FILE`): one baseline is recorded first, and each gate run is compared with it. On a
  machine whose speed drifts between jobs this is the harder case; the recorded run-to-run spread widens the CI.

Prints every run and the totals; exits 1 when the targets (at most 1 false alarm, at least 19 of 20 detected) are
missed. Interleaved (each round a lockstep pair) with 3 rounds: about 16 minutes on 2 CPU cores.

    python benchmarks/gate_reliability.py [--mode interleaved|stored] [--runs 20] [--rounds 3] [--slowdown 0.15]
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

from tune_advisor import results
from tune_advisor.gate import DEFAULT_CHECKS, record_baseline, run_gate
from tune_advisor.probe.spec import Protocol

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "benchmarks" / "workloads" / "gate_slowdown.py"
ENV = "TUNE_ADVISOR_SLOWDOWN"
# Short rounds: enough steps for a stable rate on a ~20 ms step, capped so a noisy round cannot run long.
PROTOCOL = Protocol(warmup_steps=3, min_steps=20, min_time_s=1.0, max_steps=200, max_time_s=3.0)


def scratch_repo() -> Path:
    """A git repository whose HEAD holds the workload "before the change" (blind to ENV); returns the working copy,
    which reads ENV (the change, when ENV is set)."""
    repo = Path(tempfile.mkdtemp(prefix="gate-reliability-repo-"))
    working = repo / WORKLOAD.name
    text = WORKLOAD.read_text()
    assert text.count(f'"{ENV}"') == 1, "the workload reads its slowdown from one place"
    working.write_text(text.replace(f'"{ENV}"', f'"{ENV}_NOT_AT_REF"'))
    for args in (["init", "-q"], ["add", WORKLOAD.name],
                 ["-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-q", "-m", "ref"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    working.write_text(text)
    return working


def gate_once(reference: dict, slowdown: float | None, rounds: int, checks: list[str], workload: Path):
    if slowdown:
        os.environ[ENV] = str(slowdown)  # inherited by the probe children
    else:
        os.environ.pop(ENV, None)
    started = time.monotonic()
    result = run_gate(workload, checks=checks, rounds=rounds, device="cpu", protocol=PROTOCOL, **reference)
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
    parser.add_argument("--mode", choices=("interleaved", "stored"), default="interleaved")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)  # the gate's default
    parser.add_argument("--slowdown", type=float, default=0.15)
    parser.add_argument("--check", action="append", default=None, help=f"default: {', '.join(DEFAULT_CHECKS)}")
    parser.add_argument("--baseline", type=Path, default=Path("/tmp/tune-advisor-gate-reliability/baseline.json"))
    parser.add_argument("--save", type=Path, default=None, help="write every gate run's gate.json into this folder")
    args = parser.parse_args(argv)
    checks = args.check or list(DEFAULT_CHECKS)

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

    outcomes = {"unchanged": [], "slowed": []}
    for i in range(args.runs):
        for label, slowdown in (("unchanged", None), ("slowed", args.slowdown)):
            result, took = gate_once(reference, slowdown, args.rounds, checks, workload)
            outcomes[label].append(result)
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                results.write_atomic(args.save / f"run{i + 1:02d}-{label}.json", result.document)
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
          f"checks {', '.join(checks)}, {args.mode} reference")
    print(f"  no change:          {false_alarms:>2} false alarm(s) of {args.runs}   (target <= 1)   "
          f"median throughput ratio {median_ratio('unchanged'):.3f}")
    if tripped:
        print(f"    checks not passing without a change: {', '.join(tripped)}")
    print(f"  {args.slowdown:.0%} slower steps:  {detected:>2} detected of {args.runs}       (target >= "
          f"{args.runs - 1})  median throughput ratio {median_ratio('slowed'):.3f}")
    print(f"  total time {(time.monotonic() - started) / 60:.1f} min")
    if args.mode == "interleaved":
        shutil.rmtree(workload.parent, ignore_errors=True)
    return 0 if false_alarms <= 1 and detected >= args.runs - 1 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
