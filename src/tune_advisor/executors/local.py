"""Probes as child processes of this machine (probe/runner.py), one at a time: `LocalBackend`, which also measures
two probes together in lockstep (probe/lockstep.py), and `TorchrunBackend` for DDP probes, which does not."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..collectors import cuda_memory
from ..distributed.launch import TORCHRUN
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


@dataclass(frozen=True)
class PairStyle:
    """How a lockstep pair is measured (probe/lockstep.py `run_pair`'s options). `noise`: when the measurement is
    steady enough to stop: "ratio", once the two sides' ratio is known well enough (what a comparison needs), or
    "each", once each side's own step times are (what a gate reporting each side's level needs).
    `first_takes_slot0`: the side that moves first forks from zygote slot 0, so that a zygote's bias flips with
    the first mover where the caller alternates it. `match_turns`: a side with much shorter steps takes several a
    turn."""

    noise: str = "ratio"
    first_takes_slot0: bool = True
    match_turns: bool = True


RATIOS = PairStyle()  # the planner's duels and confirmation
LEVELS = PairStyle(noise="each", match_turns=False)  # the gate's rounds: each side's level, one step a turn


class LocalBackend:
    """Each probe a child process of this machine, one after another; a pair as two children in lockstep,
    measured in `style`."""

    width = 1
    can_pair = True
    fresh_parent_s = ZYGOTE_START_S

    def __init__(self, workdir: Path, pair_memory_bytes: int | None = None, style: PairStyle = RATIOS):
        self.workdir, self.pair_memory_bytes, self.style = Path(workdir), pair_memory_bytes, style

    def run(self, spec: ProbeSpec, role: str) -> ProbeResult:
        return run_probe(spec, self.workdir, role=role)

    def pair(self, specs: list[ProbeSpec], roles: list[str], first: int) -> list[ProbeResult]:
        style = self.style
        return lockstep.run_pair(specs, self.workdir, roles, first=first, noise=style.noise,
                                 first_takes_slot0=style.first_takes_slot0, match_turns=style.match_turns)

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

    def run(self, spec: ProbeSpec, role: str) -> ProbeResult:
        return run_probe(spec, self.workdir, role=role, launcher=TORCHRUN)

    def pair(self, specs: list[ProbeSpec], roles: list[str], first: int) -> list[ProbeResult]:
        raise NotImplementedError("DDP probes are not measured in lockstep pairs")
