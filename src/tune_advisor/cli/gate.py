"""CI performance gate: re-measure the workload, compare with a baseline or a git ref, fail on a real regression.

Exit codes: 0 pass, 1 regression, 2 unusable input, 3 baseline recorded on other hardware (refused).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .. import results
from ..errors import UsageError
from ..files import write_text_atomic
from ..gate import DEFAULT_MAX_ROUNDS, DEFAULT_ROUNDS, GateResult, report, run_gate
from ..probe.spec import Protocol
from . import _common
from ._common import err, handle_errors, out as stdout


@handle_errors
def command(
    file: Path = typer.Argument(..., help=_common.WORKLOAD_HELP),
    baseline: Optional[Path] = typer.Option(None, help="Baseline recorded with `tune-advisor baseline`."),
    against: Optional[str] = typer.Option(None, help="A git ref (branch, tag, commit) whose version of the "
                                                     "workload file is measured in this job, interleaved."),
    check: List[str] = typer.Option([], "--check", "-c", help="throughput:5%, step_time:5%, peak_memory:10%, "
                                                              "throughput:>=1200, step_time:<=50ms, "
                                                              "peak_memory:<=2GiB; repeatable "
                                                              "(default: throughput:5% and peak_memory:10%)."),
    settings: List[str] = typer.Option([], "--settings", help="recommended (with --from-results), baseline (the "
                                                              "file's BASELINE) or KNOB=VALUE pairs (default: the "
                                                              "baseline file's settings)."),
    from_results: Optional[Path] = typer.Option(None, help="results.json whose recommended settings "
                                                           "--settings recommended uses."),
    rounds: int = typer.Option(DEFAULT_ROUNDS, help="Probes per side (with --against: pairs, interleaved)."),
    max_rounds: Optional[int] = typer.Option(None, help="While a check is beyond its allowed change but not "
                                                        "significantly, measure one more round at a time up to "
                                                        f"this many [default: {DEFAULT_MAX_ROUNDS}, at least "
                                                        "--rounds]; --max-rounds equal to --rounds: never more."),
    allow_other_hardware: bool = typer.Option(False, help="Compare with a baseline from another machine anyway."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    probe_timeout: str = typer.Option("120s", help="Wall-clock limit of each probe."),
    min_time: Optional[float] = typer.Option(None, help="Seconds measured per round (default: the baseline's)."),
    min_steps: Optional[int] = typer.Option(None, help="Steps measured per round (default: the baseline's)."),
    warmup: Optional[int] = typer.Option(None, help="Warm-up steps (default: the baseline's)."),
    seed: int = typer.Option(0, help="Seed for the model, data order and bootstrap."),
    executor: str = typer.Option("local", help="local: probes on this machine, two sides in lockstep; ray: probes "
                                               "as Ray tasks (one GPU each), two sides one after the other "
                                               "(pip install 'tune-advisor[ray]')."),
    ray_address: Optional[str] = typer.Option(None, help="Ray cluster to join with --executor ray (e.g. auto, "
                                                         "ray://head:10001) [default: a local Ray instance]."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for gate.json."),
    junit: Optional[Path] = typer.Option(None, help="Write JUnit XML here (one testcase per check)."),
    json_out: bool = typer.Option(False, "--json", help="Print gate.json to stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and the verdict line."),
    as_workload: bool = typer.Option(False, "--workload", help=_common.AS_WORKLOAD_HELP),
) -> None:
    """CI performance gate: re-measure the workload, compare with a baseline or a git ref, fail on a real
    regression. Exit codes: 0 pass, 1 regression, 2 unusable input, 3 baseline from other hardware (refused)."""
    protocol = None
    if any(x is not None for x in (min_time, min_steps, warmup)):
        default = _baseline_protocol(baseline) if baseline and not against else Protocol()
        protocol = dataclasses.replace(default, **{k: v for k, v in (
            ("warmup_steps", warmup), ("min_steps", min_steps), ("min_time_s", min_time)) if v is not None})
    for target in (out, junit.parent if junit else None):
        if target is not None:
            _writable(target)
    show = not (quiet or json_out)
    status = err.status("inspecting the workload…") if show else None

    def on_probe(side: str, number: int, total: int) -> None:
        if status is not None:
            status.update(f"round {number} of {total}: measuring the {side}…")

    if status is not None:
        status.start()
    try:
        result = run_gate(file, baseline=baseline, against=against, checks=check, settings=settings,
                          from_results=from_results, rounds=rounds, max_rounds=max_rounds, device=device,
                          protocol=protocol, probe_timeout=probe_timeout,
                          allow_other_hardware=allow_other_hardware, seed=seed, command=sys.argv,
                          on_probe=on_probe, executor=executor, ray_address=ray_address, as_workload=as_workload)
    finally:
        if status is not None:
            status.stop()
    _write_outputs(result, out, junit)
    if json_out:
        print(json.dumps(result.document, indent=1))
    elif quiet:
        err.print(f"gate: {result.verdict}", highlight=False, markup=False)
    else:
        report.terminal(result.document, stdout)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def _baseline_protocol(path: Path) -> Protocol:
    from ..gate import baseline as baseline_mod

    return baseline_mod.read(path).protocol


def _writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{folder}: cannot write there ({exc.strerror or exc})") from None


def _write_outputs(result: GateResult, out: Path | None, junit: Path | None) -> None:
    """gate.json, JUnit XML and the step summary, written for every verdict (a refusal too): CI shows why."""
    try:
        if out is not None:
            results.write_atomic(out / "gate.json", result.document)
        if junit is not None:
            write_text_atomic(junit, report.junit(result.document))
    except OSError as exc:
        raise UsageError(f"cannot write the gate's output ({exc.strerror or exc}: {exc.filename})") from None
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(report.markdown(result.document) + "\n")
        except OSError as exc:  # a summary is a courtesy: the verdict still stands
            err.print(f"warning: cannot append to $GITHUB_STEP_SUMMARY ({exc.strerror or exc})")
