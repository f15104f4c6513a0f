"""A script's own torch.distributed process group, in script mode: a script written for torchrun initialises it
itself (`dist.init_process_group()`, env:// from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), so the tool never
does. `GroupHooks` patches, while the script runs in the probe child:

- `init_process_group`: in a single-process probe (or inspect mode) a script that calls it without torchrun's
  environment gets the one `torchrun --nproc-per-node 1` would give (a world of one on a free local port); under
  `--nproc-per-node N` torchrun has set it, and the ddp_backend knob, where it differs from the script's own
  backend, goes into the call;
- `DistributedDataParallel.__init__`: records what the script asked for; in a DDP probe the DDP knobs that differ
  from the script's own values go into the wrapper;
- `destroy_process_group` (a DDP probe only): the script's call at its end is put off, since the ranks' results
  are gathered over the same group afterwards (distributed/rank.py `finish` destroys it then).
"""

from __future__ import annotations

import inspect
import os
import socket
from typing import Any, Callable, Mapping

import torch

TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
ENV_NEEDED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what env:// reads
# knob -> DistributedDataParallel's argument, and the argument's default as the knob's value
DDP_ARGUMENTS = {"ddp_bucket_cap_mb": ("bucket_cap_mb", 25), "gradient_as_bucket_view": ("gradient_as_bucket_view",
                                                                                          False),
                 "static_graph": ("static_graph", False)}


def available() -> bool:
    return torch.distributed.is_available()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def world_of_one(environ: Mapping[str, str], port: int) -> dict[str, str]:
    """The variables `torchrun --nproc-per-node 1` would set that `environ` lacks."""
    values = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return {k: v for k, v in values.items() if k not in environ}


def backend_for(setting: str, device_type: str) -> str:
    """The ddp_backend knob's backend (as distributed/rank.py's: auto is NCCL on CUDA, gloo on the CPU)."""
    if setting == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    return setting


def baseline(seen: dict[str, Any]) -> dict[str, Any]:
    """The DDP knobs' values as the script sets them (its inspection's `seen`: GroupHooks.facts)."""
    out: dict[str, Any] = {}
    group, ddp = seen.get("process_group"), seen.get("ddp")
    if group and group.get("backend_asked") in ("gloo", "nccl"):
        out["ddp_backend"] = group["backend_asked"]
    if ddp:
        for knob, (argument, _) in DDP_ARGUMENTS.items():
            out[knob] = ddp["asked"][argument]
    return out


def changed(settings: Mapping[str, Any], baseline_: Mapping[str, Any], mapped: set[str],
            knobs: tuple[str, ...]) -> list[str]:
    """The knobs whose setting differs from the script's own value: only those are put into its calls."""
    return [k for k in knobs if k not in mapped and k in settings and k in baseline_ and settings[k] != baseline_[k]]


class GroupHooks:
    """The process-group patches of one script run. `world_size`: the probe's ranks (1: a single process);
    `apply_knobs`: put the DDP knobs that differ from the script's own (`baseline`) into its calls (probes,
    not inspect mode)."""

    def __init__(self, settings: Mapping[str, Any], device_type: str, apply_knobs: bool, mapped: set[str],
                 world_size: int, baseline_: Mapping[str, Any] | None = None, up_front: bool = False):
        self.settings, self.device_type, self.apply, self.mapped = dict(settings), device_type, apply_knobs, mapped
        self.distributed = world_size > 1
        self.baseline = dict(baseline_ or {})
        self.group: dict[str, Any] | None = None  # the script's init_process_group call
        self.ddp: dict[str, Any] | None = None  # its DDP wrapper: asked and applied
        self.env_set: dict[str, str] = {}  # torchrun's variables set for a world of one
        self.destroy_put_off = False
        # a script that reads torchrun's variables itself (its inspection found): set before it starts
        self.up_front = up_front and not self.distributed

    def install(self, patch: Callable[[Any, str, Callable[[Callable], Callable]], None]) -> None:
        """Patch through Hooks._patch (which undoes it at remove)."""
        if self.up_front:
            self._set_env()
        if not available():
            return
        from torch.nn.parallel import DistributedDataParallel

        patch(torch.distributed, "init_process_group", self._init)
        patch(DistributedDataParallel, "__init__", self._ddp_init)
        if self.distributed:
            patch(torch.distributed, "destroy_process_group", self._destroy)

    def _init(self, original):
        signature, hooks = inspect.signature(original), self

        def init(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            a = bound.arguments
            env_style = a.get("init_method") in (None, "env://") and a.get("store") is None
            if env_style and not hooks.distributed and any(k not in os.environ for k in ENV_NEEDED):
                hooks._set_env()
            asked = a.get("backend")
            if hooks.apply and hooks.distributed and changed(hooks.settings, hooks.baseline, hooks.mapped,
                                                             ("ddp_backend",)):
                a["backend"] = backend_for(hooks.settings["ddp_backend"], hooks.device_type)
            original(*bound.args, **bound.kwargs)
            hooks.group = {"backend_asked": asked, "backend": str(torch.distributed.get_backend()),
                           "world_size": torch.distributed.get_world_size(),
                           "torchrun_env_set": sorted(hooks.env_set)}

        return init

    def _set_env(self) -> None:
        self.env_set.update(world_of_one(os.environ, free_port()))
        os.environ.update(self.env_set)

    def _ddp_init(self, original):
        signature, hooks = inspect.signature(original), self

        def init(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            a = bound.arguments
            asked = {arg: a.get(arg, default) for arg, default in DDP_ARGUMENTS.values()}
            if asked["bucket_cap_mb"] is None:  # DDP's own default
                asked["bucket_cap_mb"] = DDP_ARGUMENTS["ddp_bucket_cap_mb"][1]
            if hooks.apply and hooks.distributed:
                for knob in changed(hooks.settings, hooks.baseline, hooks.mapped, tuple(DDP_ARGUMENTS)):
                    a[DDP_ARGUMENTS[knob][0]] = hooks.settings[knob]
            original(*bound.args, **bound.kwargs)
            ddp = args[0]
            if hooks.ddp is None:  # the first wrapper is the training model's
                hooks.ddp = {"asked": asked, "applied": {"bucket_cap_bytes": ddp.bucket_bytes_cap,
                                                         "static_graph": bool(ddp.static_graph),
                                                         "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view)}}

        return init

    def _destroy(self, original):
        hooks = self

        def destroy(group=None):
            if group is None or group is torch.distributed.GroupMember.WORLD:
                hooks.destroy_put_off = True  # the ranks' results are gathered over it first
                return None
            return original(group)

        return destroy

    def close(self) -> None:
        """After the run of a single process: the group the script left behind (stopped mid-loop, before its own
        destroy_process_group) is destroyed, and torchrun's variables set for it are removed."""
        if available() and not self.distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for key in self.env_set:
            os.environ.pop(key, None)
        self.env_set = {}

    def facts(self) -> dict[str, Any]:
        return {"process_group": self.group, "ddp": self.ddp, "destroy_put_off": self.destroy_put_off,
                "torchrun_env": self.up_front}


def reads_torchrun_env(exc: BaseException) -> bool:
    """Whether the script failed reading one of torchrun's variables (`os.environ["LOCAL_RANK"]`)."""
    return isinstance(exc, KeyError) and bool(exc.args) and exc.args[0] in TORCHRUN_ENV
