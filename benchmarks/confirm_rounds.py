"""How long should each side of a confirmation round in turn measure? Rounds against their spread.

A confirmation whose two settings cannot share a lockstep pair (different loaders, steps far apart) measures them
one after the other, round after round, and its CI is Student's t over the rounds. Longer windows smooth each
side's figure; more rounds shrink t. For one fixture and one candidate, ROUNDS rounds in turn per window cap,
the caps interleaved round by round (so both see the same stretches of the machine) and who goes first
alternating. Prints each round, then per cap: the geometric mean ratio, the log sd of the rounds' ratios, the mean
wall time of a round, and sd² x wall (the spread per second spent: equal values mean the cap does not matter, and
shorter rounds buy more of them). Prints the CPU model and flags first. About 3-4 minutes for the default case
on 2 cores.

With --blocks N: N confirmations one after the other, each ROUNDS rounds in turn at the first cap, as an
analysis confirms (`--analyze-protocol` measures as analyze does). Prints each block's speedup (the median of its
rounds' ratios) with its 95% CI (stats.rounds_ratio_interval, the CI a report prints), then how far apart
consecutive blocks land: a confirmation and a re-measure a minute or two later (benchmarks/reproducibility.py's
target (c): within ±5%) differ at least this much on the machine it ran on, whatever either does inside its block.

    python benchmarks/confirm_rounds.py [--rounds 8] [--caps 4 8] [--blocks N] [--analyze-protocol] [CASE]
    (cases: augment_cpu, io_bound, io_bound_32, tiny_batch_mlp, varlen_transformer)
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from tune_advisor import environment, knobs
from tune_advisor.analysis import stats
from tune_advisor.planner.ratios import window_rate
from tune_advisor.probe.runner import run_probe
from tune_advisor.probe.spec import ProbeSpec, Protocol

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # case -> (fixture, the candidate's changes over its BASELINE: what its analyses recommend)
    "augment_cpu": ("augment_cpu", {"batch_size": 128, "num_workers": 2}),
    "io_bound": ("io_bound", {"num_workers": 16}),
    "io_bound_32": ("io_bound", {"batch_size": 64, "num_workers": 32, "persistent_workers": True}),
    "tiny_batch_mlp": ("tiny_batch_mlp", {"batch_size": 512, "optimizer_impl": "fused"}),
    "varlen_transformer": ("varlen_transformer", {"batch_size": 64, "optimizer_impl": "fused"}),
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
    ap.add_argument("--blocks", type=int, default=0,
                    help="measure this many confirmations back to back at the first cap (see above)")
    ap.add_argument("--analyze-protocol", action="store_true",
                    help="measure as `tune-advisor analyze` does by default (Protocol(): 3 warm-up steps, at least "
                         "10 steps and 1 s) rather than search_quality's shorter protocol")
    args = ap.parse_args()
    protocol_base = Protocol() if args.analyze_protocol else PROTOCOL
    print(environment.machine_line())
    fixture, change = CASES[args.case]
    base = fixture_baseline(fixture)
    cand = {**base, **change}
    workload = str(ROOT / "fixtures" / f"{fixture}.py")
    print(f"{args.case}: {knobs.describe(cand, base)} against the baseline, {args.rounds} rounds in turn per cap")
    if args.blocks:
        return blocks(workload, base, cand, protocol_base, args)
    rows: dict[float, list[tuple[float, float, float]]] = {cap: [] for cap in args.caps}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for cap in (args.caps if i % 2 == 0 else list(reversed(args.caps))):
                protocol = replace(protocol_base, max_time_s=cap, min_time_s=min(protocol_base.min_time_s, cap))
                rb, rc, wall = one_round(workload, base, cand, protocol, first=i % 2, workdir=Path(tmp))
                rows[cap].append((rb, rc, wall))
                print(f"  round {i + 1} cap {cap:g} s: ratio {rc / rb:.3f}, round {wall:.1f} s", flush=True)
    print(f"{'cap':>6} {'ratio':>7} {'log sd':>7} {'round s':>8} {'sd² x s':>8} {'baseline':>9} {'candidate':>9}")
    for cap, r in rows.items():
        logs = [math.log(c / b) for b, c, _ in r]
        sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
        wall = statistics.mean(w for *_, w in r)
        base_gm = math.exp(statistics.mean(math.log(b) for b, _, _ in r))
        cand_gm = math.exp(statistics.mean(math.log(c) for _, c, _ in r))
        print(f"{cap:>6g} {math.exp(statistics.mean(logs)):>7.3f} {sd:>7.3f} {wall:>8.1f} {sd * sd * wall:>8.3f} "
              f"{base_gm:>9,.0f} {cand_gm:>9,.0f}")
    return 0


_ids = itertools.count(1)  # probe ids across rounds


def one_round(workload: str, base: dict, cand: dict, protocol: Protocol, first: int,
              workdir: Path) -> tuple[float, float, float]:
    """One round in turn, a fresh probe per side, `first` (0: the baseline) going first; prints both windows.
    Returns (baseline rate, candidate rate, the round's wall seconds)."""
    order = [("baseline", base), ("candidate", cand)][:: 1 if first == 0 else -1]
    rates, started = {}, time.monotonic()
    for side, settings in order:
        spec = ProbeSpec(id=f"r{next(_ids):03d}", workload=workload, settings=settings, device="cpu", protocol=protocol)
        result = run_probe(spec, workdir, role=side)
        if not result.ok:
            raise SystemExit(f"{side} failed: {result.status.value} {result.error}")
        rates[side] = window_rate(result)
        print(f"    {side}: {rates[side]:,.0f}/s ({sum(result.step_s):.1f} s window, {len(result.step_s)} steps)",
              flush=True)
    return rates["baseline"], rates["candidate"], time.monotonic() - started


def blocks(workload: str, base: dict, cand: dict, protocol_base: Protocol, args) -> int:
    """`args.blocks` confirmations back to back, `args.rounds` rounds each at the first cap: each block's speedup
    and CI, then how far apart consecutive blocks land and whether each block's CI holds the next block's figure."""
    cap = args.caps[0]
    protocol = replace(protocol_base, max_time_s=cap, min_time_s=min(protocol_base.min_time_s, cap))
    found, start = [], time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.blocks):
            ratios = []
            for i in range(args.rounds):
                rb, rc, _ = one_round(workload, base, cand, protocol, first=i % 2, workdir=Path(tmp))
                ratios.append(rc / rb)
            median, low, high = stats.rounds_ratio_interval(ratios)
            found.append((median, low, high))
            print(f"  block {k + 1} at {(time.monotonic() - start) / 60:.1f} min: {median:.3f}x "
                  f"[{low:.3f}, {high:.3f}] over {len(ratios)} rounds (round ratios {min(ratios):.3f}-"
                  f"{max(ratios):.3f})", flush=True)
    steps = [b[0] / a[0] for a, b in zip(found, found[1:])]
    within = sum(abs(math.log(q)) <= math.log(1.05) for q in steps)
    held = sum(a[1] <= b[0] <= a[2] for a, b in zip(found, found[1:]))
    half = statistics.median((h / lo) ** 0.5 - 1 for _, lo, h in found)
    logs = [math.log(m) for m, _, _ in found]
    print(f"{args.blocks} blocks of {args.rounds} rounds (cap {cap:g} s) over {(time.monotonic() - start) / 60:.1f} "
          f"min: block speedups {min(m for m, _, _ in found):.3f}-{max(m for m, _, _ in found):.3f}x, "
          f"log sd between blocks {statistics.stdev(logs):.3f}; a block's CI half-width (median) {half:.1%}")
    print(f"consecutive blocks within ±5% of each other: {within}/{len(steps)}; next block's figure inside a "
          f"block's 95% CI: {held}/{len(steps)}; block-to-block ratios "
          + " ".join(f"{q:.3f}" for q in steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
