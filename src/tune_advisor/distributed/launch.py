"""Launching a distributed probe: `python -m torch.distributed.run` (torchrun) runs the ordinary probe child once
per rank. The torchrun agent is the probe's process group leader, so the runner's wall-clock limit, memory sampling
and kill work as for a single process (each rank dies with the agent: `rank._die_with_parent`). TORCHRUN is the
launcher the runner is handed for such a probe (probe/process.py Launcher).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from ..probe.process import CHILD_MODULE, Spawned
from . import merge


def layout(nproc_per_node: int = 1, nnodes: int = 1, rdzv_endpoint: str | None = None) -> dict[str, Any] | None:
    """`ProbeSpec.distributed` for these options; None for a single process."""
    if nproc_per_node * nnodes <= 1:
        return None
    return {"nproc_per_node": nproc_per_node, "nnodes": nnodes, "rdzv_endpoint": rdzv_endpoint}


def command(python: str, spec_layout: dict[str, Any], argv: list[str], run_id: str) -> list[str]:
    """The torchrun command line running the probe child on every rank of this node."""
    cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(spec_layout["nproc_per_node"]),
           "--max-restarts", "0"]  # a probe that fails is a result, not something to retry
    if spec_layout["nnodes"] == 1:
        cmd.append("--standalone")  # a local rendezvous on a free port
    else:
        cmd += ["--nnodes", str(spec_layout["nnodes"]), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", spec_layout["rdzv_endpoint"], "--rdzv-id", run_id]
    return cmd + ["-m", CHILD_MODULE, *argv]


class Torchrun(Spawned):
    """A probe child started through torchrun: its agent in a session (= process group) of its own."""

    def __init__(self, python: str, spec_layout: dict[str, Any], argv: list[str], log_path: Path,
                 env: dict[str, str], run_id: str):
        result_path = Path(argv[1])
        for stale in result_path.parent.glob(result_path.name + ".rank*"):
            stale.unlink(missing_ok=True)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(command(python, spec_layout, argv, run_id), stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        self.pid = self.proc.pid


class _Torchrun:
    """The launcher of distributed probes (probe/process.py Launcher): torchrun starts them; when a job leaves no
    result, merge.failure names the rank that failed first."""

    def start(self, python: str, layout: dict[str, Any], argv: list[str], log_path: Path, env: dict[str, str],
              run_id: str) -> Torchrun:
        return Torchrun(python, layout, argv, log_path, env, run_id)

    def failure(self, result_path: Path, log_tail: str) -> tuple[str, str] | None:
        return merge.failure(result_path, log_tail)


TORCHRUN = _Torchrun()


def check(nproc_per_node: int, nnodes: int, rdzv_endpoint: str | None, device: str) -> dict[str, Any] | None:
    """Validate the distributed options (UsageError, exit 2) and return the spec's layout."""
    from ..errors import UsageError

    if nproc_per_node < 1 or nnodes < 1:
        raise UsageError(f"--nproc-per-node ({nproc_per_node}) and --nnodes ({nnodes}) must be at least 1")
    if nnodes > 1 and not rdzv_endpoint:
        raise UsageError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (a port on the first node that every "
                         "node can reach), and the same command run on every node")
    spec_layout = layout(nproc_per_node, nnodes, rdzv_endpoint)
    if spec_layout is None:
        return None
    import torch

    if not torch.distributed.is_available():
        raise UsageError("this torch build has no torch.distributed, which --nproc-per-node needs; install a torch "
                         "build with distributed support (the Linux wheels have it)")
    if device.startswith("cuda") and nproc_per_node > torch.cuda.device_count():
        raise UsageError(f"--nproc-per-node {nproc_per_node}: this machine has {torch.cuda.device_count()} CUDA "
                         "device(s); a DDP rank needs a GPU of its own")
    return spec_layout


def world_size(spec_layout: dict[str, Any] | None) -> int:
    return spec_layout["nproc_per_node"] * spec_layout["nnodes"] if spec_layout else 1
