"""How the speedup's interval over confirmation rounds reads on the rounds the committed reports recorded, before
and after it came from the same robust statistics as its centre (stats.rounds_ratio_interval), and how far two
disturbed rounds move each.

Offline: no probe runs. Each reports/**/results.json holds its confirmation's probes (roles confirm:baseline and
confirm:recommended, paired per round in the order its speedup lists them); a round's ratio is the recommended
side's window rate over the baseline's (planner/ratios.window_rate), and the floor is the CI from the rounds' steps
(planner/ratios.pair_ratio), as planner/confirm.speedup_interval takes them. Not replayed: the run's pooled lockstep
spread (it needs the whole ledger; it only matters below stats.WALSH_MIN_ROUNDS rounds, where both intervals are
Student's t) and the widening for rounds split by who went first. "before" is Student's t over the rounds' log
ratios for every round count (the interval until this change).

Then two rounds (the second and the second to last) are disturbed, as if read under a busy neighbour: the baseline
side's steps slowed so that the round reads the centre times FACTORS; both intervals are recomputed, and the width
ratio disturbed / undisturbed says how far a disturbed minute moves each: "before", "now" over the rounds alone,
"all floor", now with the floor from every round's steps, which sees the disturbed ones too, and "stated", now
with the floor from the steps of the rounds that are not strays (`stats.stray_rounds`), as planner/confirm.py
states it.
Prints the CPU each report's rounds were measured on (its `environment`).

    python benchmarks/interval_robustness.py [reports/cnn/results.json ...]
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from tune_advisor import environment
from tune_advisor.analysis import stats
from tune_advisor.planner.ratios import pair_ratio, window_rate
from tune_advisor.probe.result import ProbeResult

ROOT = Path(__file__).resolve().parents[1]
FACTORS = (1.3, 3.0)  # a disturbed round's ratio over the centre: a busy neighbour's 30%, and one 3x off


def before(ratios: list[float], within: tuple[float, float]) -> tuple[float, float, float]:
    """The interval before this change: the Hodges-Lehmann centre, the 95% CI of the geometric mean with Student's
    t over the rounds, floored by `within`, widened to hold the centre."""
    logs = np.log(np.asarray(ratios, dtype=float))
    centre = float(np.exp(stats.hodges_lehmann(logs)))
    if logs.size < 2:
        low, high = within
    else:
        half = stats.t95(logs.size - 1) * float(logs.std(ddof=1)) / np.sqrt(logs.size)
        low, high = float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
    low, high = min(low, within[0]), max(high, within[1])
    return centre, min(low, centre), max(high, centre)


def rounds(record: dict) -> list[tuple[ProbeResult, ProbeResult]]:
    """The confirmation's finished rounds as (baseline, recommended) pairs, in round order."""
    by_id = {p["id"]: p for p in record.get("probes", [])}
    ids = [i for i in (record.get("speedup") or {}).get("probes", [])
           if by_id.get(i, {}).get("role") in ("confirm:baseline", "confirm:recommended")]
    pairs = []
    for first, second in zip(ids[::2], ids[1::2]):
        a, b = ProbeResult.from_dict(by_id[first]), ProbeResult.from_dict(by_id[second])
        base, rec = (a, b) if a.role == "confirm:baseline" else (b, a)
        if base.ok and rec.ok and base.measured and rec.measured and base.role != rec.role:
            pairs.append((base, rec))
    return pairs


def width(interval: tuple[float, float, float]) -> float:
    """An interval's log width."""
    return float(np.log(interval[2] / interval[1]))


def fmt(interval: tuple[float, float, float]) -> str:
    return f"{interval[0]:.3f}x [{interval[1]:.3f}, {interval[2]:.3f}]"


def disturb(pairs: list[tuple[ProbeResult, ProbeResult]], centre: float,
            factor: float) -> list[tuple[ProbeResult, ProbeResult]]:
    """`pairs` with the second and the second-to-last round's baseline steps slowed so that each reads `centre` x
    `factor`."""
    out = list(pairs)
    for i in (1, len(pairs) - 2):
        base, rec = pairs[i]
        slow = centre * factor / (window_rate(rec) / window_rate(base))
        out[i] = (replace(base, raw={**base.raw, "step_s": [s * slow for s in base.step_s]}), rec)
    return out


def intervals(pairs: list[tuple[ProbeResult, ProbeResult]]):
    """(before, now over the rounds alone, now as stated: floored by the CI from the rounds' steps, and now with
    that floor from the steps of the rounds that are not strays: `stats.stray_rounds`)."""
    ratios = [window_rate(rec) / window_rate(base) for base, rec in pairs]
    waves = (pairs[0][0].wave, pairs[0][1].wave)
    within = pair_ratio(pairs, waves=waves)[1:]
    steady = [pair for pair, stray in zip(pairs, stats.stray_rounds(ratios)) if not stray]
    return (before(ratios, within), stats.rounds_ratio_interval(ratios), stats.rounds_ratio_interval(ratios, within),
            stats.rounds_ratio_interval(ratios, pair_ratio(steady, waves=waves)[1:]))


def replay(path: Path) -> str:
    record = json.loads(path.read_text())
    pairs = rounds(record)
    name = path.parent.relative_to(ROOT / "reports") if path.is_relative_to(ROOT / "reports") else path.parent
    if not pairs:
        return f"| {name} | 0 | (no confirmation rounds) | | |" + " |" * len(FACTORS)
    calm = intervals(pairs)
    row = f"| {name} | {len(pairs)} | {fmt(calm[0])} | {fmt(calm[3])} | {width(calm[3]) / width(calm[0]):.2f} |"
    for factor in FACTORS:
        if len(pairs) < 4:
            row += " – |"
            continue
        busy = intervals(disturb(pairs, calm[2][0], factor))
        row += " " + " / ".join(f"{width(b) / width(c):.1f}x" for b, c in zip(busy, calm)) + " |"
    return row


def main(argv: list[str]) -> None:
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "reports").glob("**/results.json"))
    machines: dict[str, list[str]] = {}
    for path in paths:
        env = json.loads(path.read_text()).get("environment") or {}
        name = path.parent.relative_to(ROOT / "reports") if path.is_relative_to(ROOT / "reports") else path.parent
        machines.setdefault(environment.machine_line(env.get("device") or "cpu", saved=env), []).append(str(name))
    print("Rounds measured on:")
    for line, names in machines.items():
        print(f"- {', '.join(names)}: {line}".replace("\n", "; "))
    print()
    print("| report | rounds | before: t over the rounds | now, as stated | width now / before | " + " | ".join(
        f"two rounds {f:g}x off, width / calm width: before / now / all floor / stated" for f in FACTORS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(FACTORS))
    for path in paths:
        print(replay(path))


if __name__ == "__main__":
    main(sys.argv[1:])
