"""`probe`: one configuration of the workload, measured once (`tune-advisor probe`), by this machine's backend
(executors/local.py: a child process, or a torchrun job for DDP)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import environment, executors, knobs
from ..distributed import launch
from ..errors import UsageError
from ..probe.result import ProbeResult
from ..probe.spec import ProbeSpec, Protocol
from .inspection import Inspection, device_facts, inspect_workload
from .options import DEFAULT_PROBE_TIMEOUT_S, parse_duration


def probe(path: str | Path, settings: dict[str, Any] | None = None, *, device: str = "auto",
          probe_timeout: str | float = DEFAULT_PROBE_TIMEOUT_S, protocol: Protocol | None = None,
          seed: int = 0, workdir: str | Path | None = None, profile: bool = False,
          nproc_per_node: int = 1, nnodes: int = 1,
          rdzv_endpoint: str | None = None, as_workload: bool = False) -> tuple[Inspection, ProbeResult]:
    """Measure one configuration: the file's BASELINE overlaid with `settings` (`profile`: run torch.profiler on
    a few extra steps afterwards; `as_workload`: load a file that looks like a plain script as a workload)."""
    try:
        overrides = knobs.validate_settings(settings or {})
    except ValueError as exc:
        raise UsageError(f"--set: {exc}") from None
    device = environment.resolve_device(device)
    layout = launch.check(nproc_per_node, nnodes, rdzv_endpoint, device)
    if workdir is None:  # nothing to keep: the probe's files go to a folder removed afterwards
        with tempfile.TemporaryDirectory(prefix="tune-advisor-probe-") as tmp:
            return probe(path, settings, device=device, probe_timeout=probe_timeout, protocol=protocol, seed=seed,
                         workdir=tmp, profile=profile, nproc_per_node=nproc_per_node, nnodes=nnodes,
                         rdzv_endpoint=rdzv_endpoint, as_workload=as_workload)
    workdir = Path(workdir)
    info = inspect_workload(path, device, workdir, as_workload=as_workload)
    full = {**info.baseline, **overrides}
    for name, value in overrides.items():
        if name in info.baseline and info.baseline[name] == value:
            continue  # the file's own setting is not a change (a Trainer's dataloader_pin_memory=True on a CPU)
        facts = replace(device_facts(device), world_size=launch.world_size(layout))
        reason = knobs.not_applicable(name, value, info.facts, facts, full)
        if reason:
            raise UsageError(f"--set {name}={value}: {reason}")
    spec = ProbeSpec(id="probe", workload=str(info.path), settings=full, device=device,
                     protocol=protocol or Protocol(), timeout_s=parse_duration(probe_timeout), seed=seed,
                     profile=profile, distributed=layout, preload=info.preload)
    backend = executors.local_backend(device, layout, workdir, None)
    try:
        return info, backend.run(spec, "probe")
    finally:
        backend.close()
