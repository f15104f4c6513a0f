"""Does a probe's figure measure the steady state, whatever its window? Against an analytical truth.

benchmarks/workloads/sleep_loader.py reads each record with a known sleep, and its model step is negligible, so
with W persistent loader workers the steady state is W records per record-time. The record-time is measured
here, in this process (a sleep overshoots its request by a machine-dependent amount), as the mean of many
__getitem__ calls. Each W is probed with a short window (1-2 s) and a long one (8-10 s); the figure of each must
be within 5% of the computed value: start-up excluded, neither the drain of the queue filled during warm-up nor
a cold first epoch counted as typical.

    python benchmarks/steady_state.py [W ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tune_advisor import api, environment
from tune_advisor.probe.spec import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent / "workloads"))
from sleep_loader import RECORD_S, SleepDataset  # noqa: E402  (the benchmark's own workload, by path)

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "benchmarks" / "workloads" / "sleep_loader.py"
WINDOWS = {"short": Protocol(min_time_s=1.0, max_time_s=2.0, min_steps=10),
           "long": Protocol(min_time_s=8.0, max_time_s=10.0, min_steps=10)}
TOLERANCE = 0.05


def record_seconds(calls: int = 300) -> float:
    """The real cost of one record of the workload's dataset, in this process."""
    dataset = SleepDataset()
    started = time.perf_counter()
    for i in range(calls):
        dataset[i]
    return (time.perf_counter() - started) / calls


def main(args: list[str]) -> int:
    workers = [int(a) for a in args] or [1, 2, 4, 8, 16, 32]
    print(environment.machine_line())
    record_s = record_seconds()
    print(f"record time: {record_s * 1e3:.3f} ms measured here (the sleep asks {RECORD_S * 1e3:.3f} ms)")
    workdir = Path(tempfile.mkdtemp(prefix="steady-"))
    misses = 0
    print(f"{'workers':>7} {'window':>6} {'steps':>6} {'measured':>10} {'computed':>10} {'ratio':>6}")
    for w in workers:
        truth = w / record_s
        for name, protocol in WINDOWS.items():
            _, result = api.probe(WORKLOAD, {"num_workers": w}, device="cpu", protocol=protocol, workdir=workdir)
            if not result.ok:
                print(f"{w:>7} {name:>6} probe {result.status.value}: {result.error}")
                misses += 1
                continue
            rate = result.throughput()[0]
            ratio = rate / truth
            misses += abs(ratio - 1) > TOLERANCE
            print(f"{w:>7} {name:>6} {len(result.step_s):>6} {rate:>10.1f} {truth:>10.1f} {ratio:>6.3f}"
                  f"{'' if abs(ratio - 1) <= TOLERANCE else '  MISS'}", flush=True)
    print(f"{misses} of {2 * len(workers)} figures outside ±{TOLERANCE:.0%} of the computed steady state")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
