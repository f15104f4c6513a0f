"""Measure one configuration of a workload and print its numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from .. import api
from ..probe.spec import Protocol
from ..render.terminal import probe_table
from . import _common
from ._common import handle_errors, out, parse_sets


@handle_errors
def command(
    file: Path = typer.Argument(..., help=_common.WORKLOAD_HELP),
    set_: List[str] = typer.Option([], "--set", "-s", help="KNOB=VALUE over the file's BASELINE; repeatable."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    probe_timeout: str = typer.Option("120s", help="Wall-clock limit of the probe (e.g. 90s, 5m)."),
    min_time: float = typer.Option(1.0, help="Measure at least this many seconds after warm-up."),
    min_steps: int = typer.Option(10, help="Measure at least this many steps after warm-up."),
    warmup: int = typer.Option(3, help="Warm-up steps excluded from the timing."),
    json_out: bool = typer.Option(False, "--json", help="Print the PROBE object of results.json to stdout."),
    workdir: Optional[Path] = typer.Option(None, help="Keep the probe's spec, result and log here."),
    profile: bool = typer.Option(False, "--profile", help="Run torch.profiler on a few extra steps after the "
                                                          "measured ones; the trace is kept with --workdir."),
    nproc_per_node: int = typer.Option(1, help="Probe DDP training under torchrun with N processes per node."),
    nnodes: int = typer.Option(1, help="Nodes of the DDP probe; run the same command on every node."),
    rdzv_endpoint: Optional[str] = typer.Option(None, help="HOST:PORT of the torchrun rendezvous for --nnodes > 1."),
    as_workload: bool = typer.Option(False, "--workload", help=_common.AS_WORKLOAD_HELP),
) -> None:
    """Measure one configuration of a workload and print its numbers."""
    protocol = Protocol(warmup_steps=warmup, min_steps=min_steps, min_time_s=min_time)
    _, result = api.probe(file, parse_sets(set_), device=device, probe_timeout=probe_timeout, protocol=protocol,
                          workdir=workdir, profile=profile, nproc_per_node=nproc_per_node, nnodes=nnodes,
                          rdzv_endpoint=rdzv_endpoint, as_workload=as_workload)
    if json_out:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        probe_table(result, out)
        collector_lines(result.extra, workdir)
        distributed_lines(result.extra.get("distributed"))


def distributed_lines(ddp: Optional[dict]) -> None:
    """A DDP probe: each rank's step time and data wait, the straggler spread and the communication share."""
    if not ddp:
        return
    for r in ddp["ranks"]:
        local = f", {r['local_step_s'] * 1e3:.2f} ms without gradient sync" if r["local_step_s"] else ""
        out.print(f"rank {r['rank']} ({r['host']}, {r['device']}): step {r['step_time_s']['median'] * 1e3:.2f} ms, "
                  f"data wait {r['data_wait_frac']:.1%}{local}", highlight=False)
    if ddp.get("comm_frac") is not None:
        out.print(f"{ddp['world_size']} ranks ({ddp['backend']}): gradient sync {ddp['comm_frac']:.0%} of the step, "
                  f"straggler spread {ddp['straggler_spread']:.0%} (slowest: rank {ddp['slowest_rank']})",
                  highlight=False)


def collector_lines(extra: dict, workdir: Optional[Path]) -> None:
    """A few lines on what the collectors found: MFU, the profile's breakdown and top operators."""
    flops = extra.get("flops") or {}
    if flops.get("per_step"):
        line = f"FLOPs: {flops['per_step'] / 1e9:.3g} GFLOP/step, {flops['achieved_flops_per_s'] / 1e12:.3g} TFLOP/s"
        if flops.get("mfu") is not None:
            line += (f", {flops['mfu']:.1%} of the measured {flops['peak_dtype']} peak "
                     f"({flops['peak_flops_per_s'] / 1e12:.3g} TFLOP/s)")
        elif flops.get("mfu_unavailable"):
            line += f", MFU unavailable: {flops['mfu_unavailable']}"
        out.print(line, highlight=False)
    profile = extra.get("profile")
    if not profile:
        return
    shares = ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in profile["breakdown_frac"].items() if v)
    out.print(f"profiled step ({profile['steps']} steps after the measured ones): {shares}", highlight=False)
    top = ", ".join(f"{op['name']} {op['self_s_per_step'] * 1e3:.2f} ms" for op in profile["top_ops_host"][:5])
    out.print(f"top host ops (self time per step): {top}", highlight=False)
    trace = profile.get("trace") or {}
    if trace.get("file") and workdir is not None:
        out.print(f"trace: {workdir / trace['file']} (open in https://ui.perfetto.dev)", highlight=False)
    elif trace.get("note"):
        out.print(f"trace: {trace['note']}", highlight=False)
    else:
        out.print("trace: not kept (pass --workdir to keep it)", highlight=False)
