"""Measure one configuration of a workload and print its numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .. import api
from ..probe.spec import Protocol
from ..render.terminal import probe_table
from ._common import handle_errors, out, parse_sets


@handle_errors
def command(
    file: Path = typer.Argument(..., help="The workload file (defines build_model() and build_dataset())."),
    set_: List[str] = typer.Option([], "--set", "-s", help="KNOB=VALUE over the file's BASELINE; repeatable."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    probe_timeout: str = typer.Option("120s", help="Wall-clock limit of the probe (e.g. 90s, 5m)."),
    min_time: float = typer.Option(1.0, help="Measure at least this many seconds after warm-up."),
    min_steps: int = typer.Option(10, help="Measure at least this many steps after warm-up."),
    warmup: int = typer.Option(3, help="Warm-up steps excluded from the timing."),
    json_out: bool = typer.Option(False, "--json", help="Print the PROBE object of results.json to stdout."),
    workdir: Optional[Path] = typer.Option(None, help="Keep the probe's spec, result and log here."),
) -> None:
    """Measure one configuration of a workload and print its numbers."""
    protocol = Protocol(warmup_steps=warmup, min_steps=min_steps, min_time_s=min_time)
    _, result = api.probe(file, parse_sets(set_), device=device, probe_timeout=probe_timeout, protocol=protocol,
                          workdir=workdir)
    if json_out:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        probe_table(result, out)
