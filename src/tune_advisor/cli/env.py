"""Show what the tool sees: device, GPU, driver, CUDA, cuDNN, CPU, native types, torch threads, NVML, measured
peaks."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from .. import environment
from ..collectors import flops, nvml
from ._common import handle_errors, out


def gather(device: str, measure_peaks: bool = False) -> dict[str, Any]:
    """The environment record of results.json plus the build and collector facts `env` shows."""
    import torch

    info = environment.collect(device)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    info.update({
        "cuda_available": torch.cuda.is_available(),
        "cuda_build": torch.version.cuda,
        "cudnn": cudnn,
        "nvml": nvml.nvml_status(),
        "compile": environment.compile_unavailable(device.split(":")[0]) or "available",
    })
    key = flops.peak_key(device)
    if measure_peaks:  # asked for: a calibration recorded as failed or cut short runs again
        peaks, status = flops.ensure_peaks(device, retry=True)
    else:
        peaks, status = flops.peak_status(device, key)
        status = status or "not measured (use --measure-peaks)"
    info["peaks"] = {"status": status, "flops_per_s": peaks, "gaps": flops.peak_gaps(device, key)}
    return info


@handle_errors
def command(
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    json_out: bool = typer.Option(False, "--json", help="Print the facts as JSON to stdout."),
    measure_peaks: bool = typer.Option(False, "--measure-peaks",
                                       help="Measure the device's peak matmul FLOP/s per dtype (once per machine, "
                                            "cached) so probes report MFU."),
) -> None:
    """Show what the tool sees: device, GPU, driver, CUDA, cuDNN, CPU, native types, torch threads, NVML, measured
    peaks."""
    info = gather(environment.resolve_device(device), measure_peaks)
    if json_out:
        print(json.dumps(info, indent=1, default=str))
        return
    table = Table(title="tune-advisor env", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for label, value in rows(info):
        table.add_row(label, value)
    out.print(table)


def rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    gpu = info.get("gpu") or {}
    nv = info["nvml"]
    listed = ", ".join(f"{g['index']}: {g['name']}" for g in nv.get("gpus", []))
    peaks = info["peaks"]
    roof = ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s" for k, v in (peaks["flops_per_s"] or {}).items())
    if roof and peaks.get("gaps"):
        roof += "; " + "; ".join(f"{k} {why}" for k, why in peaks["gaps"].items())
    native = "; ".join(f"{k} {'yes' if v['native'] else 'no'}: {v['reason']}"
                       for k, v in (info.get("native_types") or {}).items())
    return [
        ("device", f"{info['device']} ({info['device_name']})"),
        ("GPU", f"{gpu['name']}, {gpu['memory_total_bytes'] / 2**30:.1f} GiB, capability {gpu['capability']}, "
                f"bf16 {'yes' if gpu['bf16_supported'] else 'no'}" if gpu else "none used"),
        ("driver", str(nv.get("driver") or gpu.get("driver") or "none")),
        ("CUDA", f"torch built with {info['cuda_build'] or 'no CUDA'}; available: {info['cuda_available']}"
                 + (f"; driver supports {nv['cuda_driver']}" if nv.get("cuda_driver") else "")),
        ("cuDNN", str(info["cudnn"] or "none")),
        ("CPU", info["cpu_model"]),
        ("CPU flags", ", ".join(info["cpu_flags"]) or "none of avx2/avx512/bf16/amx"),
        ("native types", native or "unknown"),
        ("cores", f"{info['cpu_count']} logical; torch uses {info['torch_threads']} intra-op threads"),
        ("memory", f"{info['memory_total_bytes'] / 2**30:.1f} GiB"),
        ("torch / python", f"{info['torch']} / {info['python']}"),
        ("platform", info["platform"]),
        ("NVML", nv["status"] + (f"; GPUs: {listed}" if listed else "")),
        ("torch.compile", str(info.get("compile", "unknown"))),
        ("peak FLOP/s", roof or peaks["status"]),
        ("fingerprint", info["fingerprint"]),
    ]
