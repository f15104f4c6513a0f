"""Where probes run: the ProbeBackend implementations (the interface: probe/backend.py).

local.py  child processes of this machine, one at a time: LocalBackend (lockstep pairs, in the planner's style or
          the gate's: PairStyle) and, for DDP probes, TorchrunBackend (no pairs)
ray.py    `--executor ray`: Ray tasks on a cluster or a local Ray instance, independent probes side by side
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..probe.backend import ProbeBackend
from .local import LEVELS, LocalBackend, TorchrunBackend, pair_memory

EXECUTORS = ("local", "ray")


def check(name: str, address: str | None) -> None:
    """UsageError for an unknown `--executor` or a `--ray-address` without `--executor ray`."""
    if name not in EXECUTORS:
        raise UsageError(f"--executor {name}: expected one of {', '.join(EXECUTORS)}")
    if name == "local" and address:
        raise UsageError("--ray-address needs --executor ray")


def connect(name: str, address: str | None, device: str, workdir: Path) -> ProbeBackend | None:
    """The backend of a remote executor (`--executor ray`), connected now; None for `local`. Raises UsageError."""
    check(name, address)
    if name == "local":
        return None
    from .ray import RayBackend

    return RayBackend(address, device, workdir)


def local_backend(device: str, layout: dict[str, Any] | None, workdir: Path, memory_budget: int | None) -> ProbeBackend:
    """Probes on this machine: DDP probes through torchrun when there is a `layout` (distributed/launch.py), else
    single processes, paired within `memory_budget` (executors.local.pair_memory)."""
    if layout is not None:
        return TorchrunBackend(workdir)
    return LocalBackend(workdir, pair_memory(device, memory_budget))


def gate_backend(name: str, address: str | None, device: str, workdir: Path) -> ProbeBackend:
    """The gate's backend: the remote executor's (`--executor ray`), connected now, else this machine's, whose
    lockstep pairs stop once each side's level is steady (`LEVELS`): the gate reports both levels."""
    return connect(name, address, device, workdir) or LocalBackend(workdir, style=LEVELS)
