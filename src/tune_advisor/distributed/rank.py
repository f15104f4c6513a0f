"""Inside one torchrun rank of a distributed probe: join the process group, wrap the model in DDP, shard the data,
keep the ranks in step, and gather every rank's measurements, which each node's first rank writes as the probe's
one result.

The probe child's entry (`child.py`) sets the rank up, hands it to `probe/training.py` as its `Group` and calls
`finish`, only when the spec is distributed; a single-process probe never initialises torch.distributed. Every rank
writes its own `RESULT.json.rank<N>` too, so that when a rank fails (and torchrun ends the others) the parent can
still say which rank failed and why (`distributed.merge.failure`).

A script written for torchrun (script mode) joins its group itself: `setup_script` gives its `ScriptRank`, which
initialises nothing, and `finish` gathers over the script's group.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

LOCAL_STEPS = 8  # steps timed without gradient sync after the measured ones: each rank's own work per step
PR_SET_PDEATHSIG = 1

current: "Rank | ScriptRank | None" = None  # the rank this process runs, set by setup() for finish()


def backend_for(setting: str, device_type: str) -> str:
    """The `ddp_backend` knob: auto is NCCL on CUDA and gloo on the CPU."""
    if setting == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    return setting


def _die_with_parent() -> None:
    """torchrun starts each rank in a session of its own, so killing the probe's process group (a timeout, Ctrl-C)
    reaches only the torchrun agent: the kernel then kills this rank too (its loader workers notice and exit)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        if os.getppid() == 1:  # the agent died before the call above
            os._exit(1)


class Rank:
    """This process's place in the job (from torchrun's environment) and the DDP settings of the probe."""

    def __init__(self, spec):
        missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR") if k not in os.environ]
        if missing:
            raise RuntimeError(f"a distributed probe must run under torchrun ({', '.join(missing)} not set)")
        _die_with_parent()
        self.spec, self.settings = spec, spec.settings
        self.rank, self.local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        device_type = torch.device(spec.device).type
        self.device = torch.device(f"cuda:{self.local_rank}") if device_type == "cuda" else torch.device("cpu")
        if device_type == "cuda":
            torch.cuda.set_device(self.device)
        self.backend = backend_for(self.settings["ddp_backend"], device_type)
        # A rank that waits longer than the probe's own limit is stuck: the parent kills the job by then anyway.
        dist.init_process_group(self.backend, timeout=timedelta(seconds=max(30.0, spec.timeout_s)))

    def wrap(self, model):
        """DistributedDataParallel with the probe's DDP knobs (the model is on this rank's device already)."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[self.local_rank] if self.device.type == "cuda" else None,
                  bucket_cap_mb=self.settings["ddp_bucket_cap_mb"],
                  gradient_as_bucket_view=bool(self.settings["gradient_as_bucket_view"]),
                  static_graph=bool(self.settings["static_graph"]))
        # Proof the knobs took effect, read back from the wrapper
        self.applied = {"bucket_cap_bytes": ddp.bucket_bytes_cap, "static_graph": bool(ddp.static_graph),
                        "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view)}
        return ddp

    def sampler(self, dataset, seed: int):
        """Each rank reads its own shard of a map-style dataset; an IterableDataset is read whole by every rank."""
        from torch.utils.data import DistributedSampler, IterableDataset

        if isinstance(dataset, IterableDataset):
            return None
        return DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True, seed=seed)

    def agree(self, stop: bool) -> bool:
        """Rank 0's stop decision for every rank: ranks that ran different step counts would wait on each other's
        gradient all-reduce forever. Called between timed steps, never inside one."""
        flag = torch.tensor([1 if stop else 0], device=self.device if self.backend == "nccl" else "cpu")
        dist.broadcast(flag, src=0)
        return bool(flag.item())

    def local_steps(self, model, run_step: Callable[[int], float]) -> list[float]:
        """Step times with the gradient all-reduce switched off (`no_sync`): this rank's own data wait and compute.

        Run after the measured steps, the same count on every rank. The difference to the synced step is what
        communication (and waiting for slower ranks) costs (rules TA601, TA602)."""
        with model.no_sync():
            return [run_step(i) for i in range(LOCAL_STEPS)]

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
                "host": socket.gethostname(), "device": str(self.device), "backend": self.backend,
                "ddp": getattr(self, "applied", None)}


class ScriptRank:
    """A rank of a script written for torchrun (script mode, script/driver.py): the script initialises the group
    and wraps its model itself, so this only reads the rank's place from torchrun's environment, agrees on when to
    stop over the script's group, and gathers the results over it (`finish`). Collectives of its own go over a gloo
    group (the script's, or one made beside an NCCL one), so a script that never set its CUDA device cannot
    mislead them."""

    def __init__(self, spec):
        missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR") if k not in os.environ]
        if missing:
            raise RuntimeError(f"a distributed probe must run under torchrun ({', '.join(missing)} not set)")
        _die_with_parent()
        self.spec = spec
        self.rank, self.local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        cuda = torch.device(spec.device).type == "cuda"
        self.device = torch.device(f"cuda:{self.local_rank}") if cuda else torch.device("cpu")
        self.applied: dict[str, Any] | None = None  # the script's DDP wrapper, as script/group.py read it back
        self._control = None

    def joined(self) -> bool:
        """Whether the script has initialised its process group."""
        return dist.is_initialized()

    def control(self):
        """The group this rank's own collectives use: the script's when it has gloo, else a gloo group made once
        (every rank makes it at the same point: its first agreement, or the gather)."""
        if self._control is None:
            self._control = dist.group.WORLD if "gloo" in str(dist.get_backend()) else dist.new_group(backend="gloo")
        return self._control

    def agree(self, stop: bool) -> bool:
        """Rank 0's decision for every rank (between the script's optimizer steps)."""
        flag = torch.tensor([1 if stop else 0])
        dist.broadcast(flag, src=0, group=self.control())
        return bool(flag.item())

    def wrapped(self, applied: dict[str, Any] | None) -> None:
        self.applied = applied

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
                "host": socket.gethostname(), "device": str(self.device),
                "backend": str(dist.get_backend()) if dist.is_initialized() else None, "ddp": self.applied}


def setup(spec) -> Rank:
    global current
    current = Rank(spec)
    return current


def setup_script(spec) -> ScriptRank:
    """A rank of a script that joins the group itself: nothing initialised here."""
    global current
    current = ScriptRank(spec)
    return current


def finish(result: dict[str, Any], result_path: Path, write_json: Callable[[Path, dict], None]) -> int:
    """Write this rank's result; on success gather every rank's, and each node's first rank writes the merged one.

    A rank that failed (or never joined the group) exits at once with code 1 instead of joining the gather: torchrun
    then ends the others, and the parent reads the rank files to name the rank that failed first."""
    from .merge import merge

    rank = current
    if isinstance(rank, ScriptRank) and result.get("status") == "ok" and not dist.is_initialized():
        result["status"], result["error"] = "error", (
            "the script's process group was gone before the ranks' results could be gathered (destroyed other than "
            "through torch.distributed.destroy_process_group, which script mode puts off until then)")
    result["rank"] = rank.describe() if rank else {"rank": int(os.environ.get("RANK", -1))}
    result["rank"]["finished_at"] = time.time()
    write_json(result_path.with_name(f"{result_path.name}.rank{result['rank']['rank']}"), result)
    if result.get("status") != "ok" or rank is None or not dist.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # not sys.exit: a process group with collectives pending can hang the interpreter's shutdown
    group = rank.control() if isinstance(rank, ScriptRank) else None  # None: the default group
    gathered: list[Any] = [None] * rank.world_size
    dist.all_gather_object(gathered, result, group=group)
    if rank.local_rank == 0:  # every node's first rank: each node's tune-advisor gets the same job result
        write_json(result_path, merge(gathered))
    dist.barrier(group=group)  # rank 0 has written the result before any rank leaves
    dist.destroy_process_group()  # a script's own group too: its destroy_process_group was put off until now
    return 0
