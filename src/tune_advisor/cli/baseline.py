"""Record a baseline for the CI gate: several rounds of one configuration, with the machine they ran on."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .. import results
from ..errors import UsageError
from ..gate import DEFAULT_ROUNDS, record_baseline
from ..probe.spec import Protocol
from . import _common
from ._common import err, handle_errors, out as stdout


@handle_errors
def command(
    file: Path = typer.Argument(..., help=_common.WORKLOAD_HELP),
    out: Path = typer.Option(Path("perf/baseline.json"), "--out", "-o", help="Where to write the baseline."),
    rounds: int = typer.Option(DEFAULT_ROUNDS, help="Probes to record; several carry the run-to-run spread."),
    settings: List[str] = typer.Option([], "--settings", help="baseline (the file's BASELINE, the default), "
                                                              "recommended (with --from-results), or KNOB=VALUE "
                                                              "pairs; repeatable or comma-separated."),
    from_results: Optional[Path] = typer.Option(None, help="results.json whose recommended settings "
                                                           "--settings recommended uses."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    probe_timeout: str = typer.Option("120s", help="Wall-clock limit of each probe."),
    min_time: float = typer.Option(1.0, help="Measure each round at least this many seconds after warm-up."),
    min_steps: int = typer.Option(10, help="Measure each round at least this many steps after warm-up."),
    warmup: int = typer.Option(3, help="Warm-up steps excluded from the timing."),
    max_time: float = typer.Option(15.0, help="Stop extending a noisy round after this many seconds."),
    seed: int = typer.Option(0, help="Seed for the model, data order and sampling."),
    json_out: bool = typer.Option(False, "--json", help="Print the baseline document to stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors (and --json output)."),
    as_workload: bool = typer.Option(False, "--workload", help=_common.AS_WORKLOAD_HELP),
) -> None:
    """Record a baseline for the CI gate: several rounds of one configuration, with the machine they ran on."""
    show = not (quiet or json_out)
    status = err.status("inspecting the workload…") if show else None

    def on_probe(side: str, number: int, total: int) -> None:
        if status is not None:
            status.update(f"baseline round {number} of {total}…")

    if status is not None:
        status.start()
    try:
        document = record_baseline(file, rounds=rounds, settings=settings, from_results=from_results, device=device,
                                   protocol=Protocol(warmup_steps=warmup, min_steps=min_steps, min_time_s=min_time,
                                                     max_time_s=max(max_time, min_time)),
                                   probe_timeout=probe_timeout, seed=seed, command=sys.argv, on_probe=on_probe,
                                   as_workload=as_workload)
    finally:
        if status is not None:
            status.stop()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        results.write_atomic(out, document)
    except OSError as exc:
        raise UsageError(f"{out}: cannot write the baseline there ({exc.strerror or exc})") from None
    if json_out:
        print(json.dumps(document, indent=1))
    elif not quiet:
        summary = document["summary"]
        tp = summary["throughput"]
        rates = ", ".join(f"{x:,.1f}" for x in tp["rounds"] if x is not None)
        stdout.print(f"baseline: {tp['median']:,.1f} {tp['unit']} (rounds: {rates}; run-to-run spread "
                     f"{tp['spread']:.1%}), fingerprint {document['environment'].get('fingerprint')}",
                     highlight=False, markup=False)
        stdout.print(f"wrote {out}", highlight=False, markup=False)
