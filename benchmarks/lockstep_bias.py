"""Does a lockstep pair read the same speedup as the two settings run alone, one after the other?

The planner's duels and the confirmation measure two settings together, step by step (probe/lockstep.py), so
that the machine's moments hit both alike. A user trains one setting alone. For each case: ROUNDS rounds, each a
lockstep pair of baseline and candidate with one step a turn (who moves first alternating), the same pair with
matched turns (the side with much shorter steps takes several a turn, as the planner's duels do since 2026-11-26:
probe/lockstep.py), then each of the two alone in a fresh probe (who goes first alternating). Prints each round's
rates and ratios, then the geometric mean of each kind of lockstep ratio over that of the ratios alone, with the
spread of a setting's rate between fresh processes. Prints the CPU model and flags first. About 50 s a round for
cnn_128, 35-45 s for hf_transformer_32 and varlen_transformer, on 2 cores (an Intel Xeon, 2026-11-26).

    python benchmarks/lockstep_bias.py [--rounds 4] [CASE ...]   (cases: cnn, tiny_batch_mlp, lstm_collate,
                                                                 lstm_collate_256, varlen_transformer, cnn_128,
                                                                 hf_transformer_32, augment_cpu_128, ...)
    python benchmarks/lockstep_bias.py --timed-only --window-s 4 --rounds 12 tiny_batch_mlp_fused
        only the confirmation's kind of pair where steps lie far apart: half-second turns, each side's window
        capped at 4 s (CONFIRM_TURN_WINDOW_S), against the two alone
    python benchmarks/lockstep_bias.py --device cuda --rounds 4 cnn_128_cl     (on a GPU)
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

from tune_advisor import environment, knobs
from tune_advisor.analysis import stats
from tune_advisor.api.inspection import inspect_workload
from tune_advisor.planner.ratios import window_rate
from tune_advisor.planner.confirm import step_ratio
from tune_advisor.probe import lockstep
from tune_advisor.probe.runner import run_probe
from tune_advisor.probe.spec import ProbeSpec, Protocol

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # case -> (fixture, the candidate's changes over its BASELINE: what its analyses recommend[, the reference's])
    "cnn": ("cnn", {"batch_size": 128, "amp": "bf16", "channels_last": True}),
    "tiny_batch_mlp": ("tiny_batch_mlp", {"batch_size": 512, "amp": "bf16"}),
    # what its analyses recommend on an Intel Xeon without AMX (steps ~3x the baseline's)
    "tiny_batch_mlp_fused": ("tiny_batch_mlp", {"batch_size": 512, "optimizer_impl": "fused"}),
    # padded batches: its reported speedups read high (issue 20); at batch 256 a step is ~10x the baseline's
    "lstm_collate": ("lstm_collate", {"batch_size": 32, "amp": "bf16"}),
    "lstm_collate_256": ("lstm_collate", {"batch_size": 256, "amp": "bf16"}),
    # batch changes whose steps are 1.5-2x apart: reproducibility misses at d29d05d (reported 5-7% high)
    "varlen_transformer": ("varlen_transformer", {"batch_size": 64}),
    "varlen_transformer_fused": ("varlen_transformer", {"batch_size": 64, "optimizer_impl": "fused"}),
    "cnn_128": ("cnn", {"batch_size": 128}),
    # a batch rung whose lockstep duels read 32 over 16 at 1.18x where the grid's probes alone put it at 0.91-1.02x
    "hf_transformer_32": ("hf_transformer", {"batch_size": 32}, {"batch_size": 16}),
    # a batch rung with CPU-bound loader workers on both sides: a paused side's workers refill their queue during
    # the partner's turn (one augment_cpu run read 128 over 64 at 1.10x, 1.11x and 1.01x in lockstep; its grid 1.13x)
    "augment_cpu_128": ("augment_cpu", {"batch_size": 128, "num_workers": 2}, {"batch_size": 64, "num_workers": 2}),
    # what cnn's analyses recommend on an NVIDIA H200, whose confirmations read 1.05-1.32x the speedup re-measured
    # in fresh probes alone (benchmarks/reproducibility.py --device cuda, 2026-11-27)
    "cnn_128_cl": ("cnn", {"batch_size": 128, "channels_last": True}),
    # the baseline against itself (A/A): does the side that warmed up second read slower? tiny_batch_mlp's
    # confirmations read its baseline ~15% slower in the rounds where the recommendation moved (and warmed up) first
    "tiny_batch_mlp_aa": ("tiny_batch_mlp", {}),
    # steps 1.1x apart (a step a turn): its confirmations read 1.15x where its re-measures alone read 1.20-1.22x
    # (AMD EPYC, 2026-11-28)
    "raw_sensor_mlp_fused": ("raw_sensor_mlp", {"optimizer_impl": "fused"}),
}


class Probes:
    def __init__(self, name: str, workdir: Path, device: str = "cpu"):
        self.workdir, self.n, self.device = workdir, 0, device
        self.info = inspect_workload(ROOT / "fixtures" / f"{name}.py", device, workdir)

    def spec(self, settings: dict, turn_s: float | None = None, window_s: float | None = None) -> ProbeSpec:
        self.n += 1
        protocol = Protocol(turn_s=turn_s) if window_s is None else Protocol(turn_s=turn_s, max_time_s=window_s)
        return ProbeSpec(id=f"b{self.n:03d}", workload=str(self.info.path), settings=settings,
                         device=self.device, protocol=protocol)

    def pair(self, a: dict, b: dict, first: int, match_turns: bool = False, turn_s: float | None = None,
             window_s: float | None = None) -> tuple[float, float, float]:
        """The two sides' rates in one lockstep pair, and how far apart their median steps are."""
        ra, rb = lockstep.run_pair([self.spec(a, turn_s, window_s), self.spec(b, turn_s, window_s)], self.workdir,
                                   ["baseline", "candidate"], first=first, match_turns=match_turns)
        return window_rate(ra), window_rate(rb), step_ratio(ra, rb)

    def alone(self, settings: dict) -> float:
        return window_rate(run_probe(self.spec(settings), self.workdir, role="alone"))


def gmean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def case(name: str, rounds: int, turn_s: float, timed_only: bool = False, window_s: float | None = None,
         device: str = "cpu") -> None:
    fixture, changes, *reference = CASES[name]
    probes = Probes(fixture, Path(tempfile.mkdtemp(prefix=f"lockstep-bias-{name}-")), device)
    base = {**probes.info.baseline, **(reference[0] if reference else {})}
    cand = {**base, **changes}
    against = knobs.describe(reference[0]) if reference else "the baseline"
    print(f"{name}: {fixture}, {knobs.describe(changes)} against {against}", flush=True)
    paired, matched, timed, alone, apart, rates = [], [], [], [], [], {"baseline": [], "candidate": []}
    for i in range(rounds):
        ta, tb, steps = probes.pair(base, cand, first=i % 2, turn_s=turn_s, window_s=window_s)
        timed.append(tb / ta)
        a, b, steps = (ta, tb, steps) if timed_only else probes.pair(base, cand, first=i % 2)
        ma, mb, _ = (ta, tb, steps) if timed_only else probes.pair(base, cand, first=i % 2, match_turns=True)
        matched.append(mb / ma)
        apart.append(steps)
        order = ("baseline", "candidate") if i % 2 == 0 else ("candidate", "baseline")
        solo = {role: probes.alone(base if role == "baseline" else cand) for role in order}
        paired.append(b / a)
        alone.append(solo["candidate"] / solo["baseline"])
        for role in rates:
            rates[role].append(solo[role])
        kinds = "" if timed_only else (f"lockstep {a:,.0f} -> {b:,.0f} ({paired[-1]:.3f}x, steps {steps:.2f}x "
                                       f"apart); matched turns {ma:,.0f} -> {mb:,.0f} ({matched[-1]:.3f}x); ")
        print(f"  round {i + 1}: {kinds}{turn_s:g} s turns {ta:,.0f} -> {tb:,.0f} ({timed[-1]:.3f}x); alone "
              f"{solo['baseline']:,.0f} -> {solo['candidate']:,.0f} ({alone[-1]:.3f}x)", flush=True)
    lo_a, hi_a = stats.rounds_ratio_interval(alone)[1:]
    print(f"  alone {gmean(alone):.3f}x [{lo_a:.3f}, {hi_a:.3f}] (95% CI over the rounds); median steps "
          f"{stats.median(apart):.2f}x apart")
    kinds = (() if timed_only else (("lockstep, one step a turn", paired), ("lockstep, matched turns", matched)))
    for kind, ratios in (*kinds, (f"lockstep, turns of {turn_s:g} s", timed)):
        low, high = stats.rounds_ratio_interval(ratios)[1:]
        over = [p / q for p, q in zip(ratios, alone)]
        _, over_low, over_high = stats.rounds_ratio_interval(over)
        print(f"  {kind}: {gmean(ratios):.3f}x [{low:.3f}, {high:.3f}]; over alone {gmean(over):.3f} "
              f"[{over_low:.3f}, {over_high:.3f}] (95% CI over the rounds' quotients), higher in "
              f"{sum(o > 1 for o in over)} of {rounds} rounds")
    for role, values in rates.items():
        print(f"  {role} alone, fresh processes: {min(values):,.0f} to {max(values):,.0f} "
              f"(high/low {max(values) / min(values):.2f})")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"any of {', '.join(CASES)} (default: all)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--turn-s", type=float, default=0.5,
                        help="the third kind of pair: each side takes the steps nearest this many seconds a turn")
    parser.add_argument("--timed-only", action="store_true",
                        help="only the pairs in timed turns (the confirmation's kind where steps lie far apart)")
    parser.add_argument("--window-s", type=float, default=None,
                        help="cap each side's window of a pair at this (the confirmation's: 4)")
    parser.add_argument("--device", default="cpu", help="where the probes train (default cpu)")
    args = parser.parse_args(argv)
    unknown = set(args.cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}: pick from {', '.join(CASES)}")
    print(environment.machine_line(args.device))
    for name in args.cases or CASES:
        case(name, args.rounds, args.turn_s, args.timed_only, args.window_s, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
