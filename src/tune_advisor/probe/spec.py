"""What a probe is asked to do (frozen) — kept apart from what it measured (`result.py`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

COMPILE_TIME_FACTOR = 3


@dataclass(frozen=True)
class Protocol:
    """The measurement protocol of SPEC §4. Defaults suit seconds-long probes on small models."""

    warmup_steps: int = 3  # excluded: first-batch worker start-up, allocator growth, autotuning
    min_steps: int = 10
    min_time_s: float = 1.0
    max_steps: int = 200  # cap on extending a noisy measurement
    max_time_s: float = 15.0
    noise_bar: float = 0.1  # keep measuring while IQR/median of step times exceeds this
    # Lockstep pairs only (probe/lockstep.py): each side's turn lasts about this long, in whole steps; None:
    # matched turns (one step a turn, or the partner's step's worth of steps for a side with far shorter ones).
    turn_s: float | None = None


@dataclass(frozen=True)
class ProbeSpec:
    id: str
    workload: str  # absolute path of the workload file
    settings: dict[str, Any]  # every knob
    device: str = "cpu"
    protocol: Protocol = field(default_factory=Protocol)
    timeout_s: float = 120.0  # wall-clock limit of the whole child process
    seed: int = 0
    mode: str = "probe"  # "probe" measures; "inspect" loads and checks the workload and reports its facts
    profile: bool = False  # run torch.profiler on a few extra steps after the measured ones (designated probes)
    count_flops: bool = True  # count one step's FLOPs after the measured ones (not for re-measurements)
    distributed: dict[str, Any] | None = None  # DDP under torchrun: distributed.launch.layout(); None: one process
    # The gate's lockstep pairs (probe/lockstep.py): {"go": FIFO, "done": FIFO}; each measured step waits for the
    # parent's baton, so two children alternate step by step. None: the child measures at its own pace.
    lockstep: dict[str, str] | None = None
    budget_left_s: float | None = None  # what is left of the analysis's --budget for this probe; None: no budget
    # Script mode (script/driver.py): the workload is a plain script run as `python FILE ARGS`: {"args": [...],
    # "map": {knob: FlagMap json}, "baseline": the script's own settings, "loader_site": where it builds
    # its training DataLoader (file:line), "cwd": its folder (None: a scratch one)}. None: a build_model() workload.
    script: dict[str, Any] | None = None
    # Fork from a zygote started for this probe (probe/runner.py), not one an earlier probe forked from. A zygote's
    # children share its memory layout (address-space randomisation is drawn once, at its start), and on
    # tiny_batch_mlp's baseline the children of one zygote read ~15% slower than those of the other in every round
    # (benchmarks/results/reproducibility.md, "A zygote's children share its layout"): the confirmation draws a new
    # one for each probe where the budget left holds its start, and the gate for each of its rounds.
    fresh_parent: bool = False
    # The longest the training loader's workers may take to deliver a batch before the probe ends as a timeout
    # (probe/measure.py LoaderHung), from the baseline's batch time (planner/budget.py loader_wait_s); None: no
    # bound but the probe's own limit.
    loader_wait_s: float | None = None
    # Modules the child will import, its parent process (probe/zygote.py) imports before forking it, once for all its
    # children: a framework's (frameworks.modules), seconds each. Not for DDP probes (torchrun starts each rank).
    preload: list[str] = field(default_factory=list)

    @property
    def limit_s(self) -> float:
        """The wall-clock limit the runner enforces: torch.compile probes get COMPILE_TIME_FACTOR times the
        limit, because compiling (and recompiling for new shapes) a model on a CPU takes tens of seconds; a
        lockstep side gets twice the limit, because it waits paused while its partner takes every other step;
        and never past what is left of the budget."""
        compiling = self.settings.get("compile", "off") != "off"
        limit = self.timeout_s * (COMPILE_TIME_FACTOR if compiling else 1) * (2 if self.lockstep else 1)
        return limit if self.budget_left_s is None else min(limit, self.budget_left_s)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ProbeSpec":
        raw = json.loads(text)
        raw["protocol"] = Protocol(**raw["protocol"])
        return cls(**raw)
