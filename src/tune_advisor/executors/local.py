"""Probes as child processes of this machine (probe/runner.py), one at a time: `LocalBackend`, which also measures
two probes together in lockstep (probe/lockstep.py), and `TorchrunBackend` for DDP probes, which does not."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Iterator

from ..collectors import cuda_memory
from ..probe import lockstep
from ..probe.backend import Job
from ..probe.result import ProbeResult
from ..probe.runner import ZYGOTE_START_S, run_probe
from ..probe.spec import ProbeSpec


def pair_memory(device: str, memory_budget: int | None) -> int | None:
    """The memory two probes measured together in lockstep may use between them: the memory budget on a CPU;
    on a GPU they share its memory: most of it (of --max-memory, if smaller), less a CUDA context for each
    (collectors/cuda_memory.py)."""
    if not device.startswith("cuda"):
        return memory_budget
    import torch

    context, _ = cuda_memory.context_bytes(device)
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return cuda_memory.pair_room(total, context, memory_budget)


class LocalBackend:
    """Each probe a child process of this machine, one after another; a pair as two children in lockstep."""

    width = 1
    can_pair = True
    fresh_parent_s = ZYGOTE_START_S

    def __init__(self, workdir: Path, pair_memory_bytes: int | None = None):
        self.workdir, self.pair_memory_bytes = Path(workdir), pair_memory_bytes

    def run(self, spec: ProbeSpec, role: str) -> ProbeResult:
        return run_probe(spec, self.workdir, role=role)

    def pair(self, specs: list[ProbeSpec], roles: list[str], first: int) -> list[ProbeResult]:
        # one protocol and one limit for both: the budget left was read twice, microseconds apart
        specs = [specs[0], replace(specs[1], protocol=specs[0].protocol, budget_left_s=specs[0].budget_left_s)]
        return lockstep.run_pair(specs, self.workdir, roles, first=first, noise="ratio", first_takes_slot0=True,
                                 match_turns=True)

    def many(self, jobs: list[Job]) -> Iterator[ProbeResult]:
        for spec, role in jobs:  # one child at a time: a second would slow the first
            yield self.run(spec, role)

    def close(self) -> None:
        """Nothing to release: the probe zygotes (probe/runner.py) serve every analysis of this process."""


class TorchrunBackend(LocalBackend):
    """DDP probes: each a torchrun job of this machine, its layout in the spec (`distributed`). Never paired:
    lockstep passes its baton to one child process, not to a job of several ranks."""

    can_pair = False
    fresh_parent_s = 0.0  # torchrun starts a new process for every probe anyway

    def __init__(self, workdir: Path):
        super().__init__(workdir, pair_memory_bytes=None)

    def pair(self, specs: list[ProbeSpec], roles: list[str], first: int) -> list[ProbeResult]:
        raise NotImplementedError("DDP probes are not measured in lockstep pairs")
