"""Where does a 1-minute `analyze` spend its minute? (issue 63, part 1: the plan is shaped by it.)

For each fixture, `tune-advisor analyze FIXTURE --budget 1m` as a user runs it (its own process, default protocol,
every knob), timed from outside; then its results.json is broken into its parts, in seconds and as a share of the
command's wall time:

- CLI start and exit: the interpreter and its imports before analyze's clock starts, and what follows its last
  write (the command's wall less the in-process time: `budget.used_s` + `budget.phases.reports_s`);
- setup, inspection, calibration (the peak FLOP/s, near 0 once cached): `budget.phases`;
- the probes by role: baseline, screens (knob:, ladder:, bisect:, grid), duels (recheck), ablation, confirmation;
  a lockstep pair counts once, its wall being both sides' (they run together, taking turns);
- between probes: the plan's time outside the probes' walls (a zygote's first start, the planner's statistics,
  saving results.json after every probe);
- rules, reports; and the budget left unused.

A second table splits the probes' own time by what a probe does: its process start (fork from the zygote, or a new
one: `wall_s` less `extra.child_wall_s`), warm-up and measured windows (a pair's from its `extra.lockstep` spans,
both sides together), the profiler's extra steps (`extra.profile_wall_s`: the baseline's and the recommendation's)
and the rest of the child's time (building the model, data and loader, the FLOP count, saving its result). Then
the elapsed time of the first provisional recommendation (`budget.first_provisional_s`). Prints the CPU model and
flags first.

    python benchmarks/minute_breakdown.py [--fixtures cnn,io_bound,tiny_batch_mlp] [--budget 1m] [--out DIR]
                                          [--reuse]

`--reuse`: read the results.json already in DIR/<fixture> (and the command's wall time the run left beside it)
instead of running.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tune_advisor import environment

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FIXTURES = "cnn,io_bound,tiny_batch_mlp"
ROLES = (("baseline", ("baseline",)), ("screens (knob, ladder, bisect, grid)", ("knob:", "ladder:", "bisect:", "grid")),
         ("duels (recheck)", ("recheck",)), ("ablation", ("ablate:",)), ("confirmation", ("confirm",)))


def run(fixture: str, budget: str, out: Path) -> float:
    """`tune-advisor analyze` on the fixture, in its own process; its wall time in seconds."""
    folder = out / fixture
    command = [sys.executable, "-m", "tune_advisor", "analyze", str(ROOT / "fixtures" / f"{fixture}.py"),
               "--budget", budget, "--device", "cpu", "-o", str(folder), "--quiet"]
    began = time.monotonic()
    subprocess.run(command, check=True, cwd=ROOT)
    wall = time.monotonic() - began
    (folder / "command_wall_s.json").write_text(json.dumps({"wall_s": wall}))
    return wall


def saved_wall(folder: Path) -> float | None:
    """The command's wall time a run of this benchmark left in `folder`, or None."""
    saved = folder / "command_wall_s.json"
    return json.loads(saved.read_text())["wall_s"] if saved.exists() else None


def events(probes: list[dict]) -> list[list[dict]]:
    """The probes that ran, as the plan ran them: a lockstep pair's two sides as one event, others alone."""
    ran = [p for p in probes if p["status"] != "skipped"]
    by_id = {p["id"]: p for p in ran}
    done, out = set(), []
    for p in ran:
        if p["id"] in done:
            continue
        partner = by_id.get(((p.get("extra") or {}).get("lockstep") or {}).get("partner"))
        group = [p] if partner is None or partner["id"] in done else [p, partner]
        done.update(q["id"] for q in group)
        out.append(group)
    return out


def span(groups: list[list[float]]) -> float:
    """The wall time from the first start to the last end of [start, end] spans (both sides of a pair)."""
    flat = [s for g in groups for s in g if s and len(s) == 2]
    return max(e for _, e in flat) - min(b for b, _ in flat) if flat else 0.0


def activities(group: list[dict]) -> dict[str, float]:
    """One event's wall split into process start, build and extra steps, warm-up and measured window."""
    wall = max(p.get("wall_s") or 0.0 for p in group)
    extras = [p.get("extra") or {} for p in group]
    child = max(e.get("child_wall_s") or 0.0 for e in extras)
    if len(group) == 2:  # the sides take turns: the pair's warm-up and window are wall spans over both
        locks = [e.get("lockstep") or {} for e in extras]
        warm = span([[lk.get("warm_span")] for lk in locks])
        measured = span([lk.get("spans") or [] for lk in locks])
    else:
        warm, measured = extras[0].get("warmup_s") or 0.0, extras[0].get("measured_wall_s") or 0.0
    start = max(0.0, wall - child) if child else 0.0
    profiler = sum(e.get("profile_wall_s") or 0.0 for e in extras)
    return {"process start": start, "build, FLOP count, other": max(0.0, wall - start - warm - measured - profiler),
            "warm-up": warm, "measured windows": measured, "profiler": profiler}


def breakdown(doc: dict, wall: float | None) -> tuple[list[tuple[str, float]], list[tuple[str, float]], dict]:
    """(the parts of the run, the probes' time by activity, facts) from one results.json."""
    budget = doc["budget"]
    phases = budget.get("phases") or {}
    inside = budget["used_s"] + (phases.get("reports_s") or 0.0)
    groups = events(doc["probes"])
    by_role = {name: 0.0 for name, _ in ROLES}
    by_activity = dict.fromkeys(("process start", "build, FLOP count, other", "warm-up", "measured windows",
                                 "profiler"), 0.0)
    for group in groups:
        # a candidate screened beside the current best is a pair (recheck, knob:...): a screen; a pair of two
        # rechecks, or a recheck alone (a duel in turn), a duel
        role = next((r for r in (p.get("role") or "" for p in group) if r != "recheck"), "recheck")
        name = next((n for n, prefixes in ROLES if role.startswith(prefixes)), ROLES[1][0])
        by_role[name] += max(p.get("wall_s") or 0.0 for p in group)
        for key, value in activities(group).items():
            by_activity[key] += value
    probes_s = sum(by_role.values())
    parts = [("CLI start and exit", None if wall is None else wall - inside),
             ("setup (folder, device, backend)", phases["plan_started_s"] - phases["inspection_s"]
              - phases["calibration_s"]),
             ("inspection", phases["inspection_s"]), ("calibration (peak FLOP/s)", phases["calibration_s"]),
             *by_role.items(),
             ("between probes (zygote start, planning, saving)", phases["plan_s"] - probes_s),
             ("rules", phases.get("rules_s") or 0.0), ("reports", phases.get("reports_s") or 0.0)]
    facts = {"wall": wall, "limit": budget["limit_s"], "unused": budget["limit_s"] - inside,
             "first_provisional_s": budget.get("first_provisional_s"), "probes": len(groups),
             "probes_s": probes_s, "speedup": doc.get("speedup"),
             "changes": {k: v for k, v in (doc["recommended"] or {}).get("settings", {}).items()
                         if doc["baseline"]["settings"].get(k) != v}}
    return parts, list(by_activity.items()), facts


def table(fixture: str, parts, by_activity, facts) -> str:
    total = facts["wall"] or sum(v for _, v in parts if v is not None)
    rows = [f"### {fixture}", "", "| part | s | share |", "|---|---:|---:|"]
    rows += [f"| {name} | {'?' if v is None else f'{v:.1f}'} | {'?' if v is None else f'{v / total:.0%}'} |"
             for name, v in parts]
    rows.append(f"| **the command's wall** | **{total:.1f}** | |")
    rows.append(f"| budget left unused ({facts['limit']:.0f} s less the analysis's own time) | "
                f"{facts['unused']:.1f} | |")
    rows += ["", f"The probes' {facts['probes_s']:.1f} s ({facts['probes']} probes or pairs), by what a probe does:",
             "", "| activity | s | share of the probes' time |", "|---|---:|---:|"]
    rows += [f"| {name} | {v:.1f} | {v / facts['probes_s']:.0%} |" for name, v in by_activity]
    first = facts["first_provisional_s"]
    s = facts["speedup"]
    rows += ["", f"First provisional recommendation at {'none (no change kept)' if first is None else f'{first:.1f} s'}"
             f"; recommended: {facts['changes'] or 'the baseline'}"
             + (f", {s['median']:.2f}x [{s['ci_low']:.2f}, {s['ci_high']:.2f}] confirmed" if s else ""), ""]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fixtures", default=DEFAULT_FIXTURES, help="comma-separated fixture stems (fixtures/)")
    parser.add_argument("--budget", default="1m")
    parser.add_argument("--out", type=Path, default=Path("/tmp/minute_breakdown"))
    parser.add_argument("--reuse", action="store_true", help="read the results.json already in --out")
    args = parser.parse_args()
    print(environment.machine_line(), flush=True)
    for fixture in args.fixtures.split(","):
        if not args.reuse:
            print(f"== {fixture}: tune-advisor analyze --budget {args.budget}", flush=True)
        wall = saved_wall(args.out / fixture) if args.reuse else run(fixture, args.budget, args.out)
        doc = json.loads((args.out / fixture / "results.json").read_text())
        print(table(fixture, *breakdown(doc, wall)), flush=True)


if __name__ == "__main__":
    main()
