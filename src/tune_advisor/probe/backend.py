"""`ProbeBackend`: the one interface through which probes run: the planner's Session, the gate, `tune-advisor probe`.

The Session numbers probes and decides what to run; a `SpecMaker` (analyze's: api/facade.py ProbeSpecs) turns each
(probe id, settings, role, the budget's `ProbeLimits` for it) into a ProbeSpec; the backend runs specs and hands
back ProbeResults. The backends are in executors/ (local, torchrun, Ray); tests/fakes.py's FakeBackend synthesises
results instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

from .result import ProbeResult
from .spec import Protocol as MeasureProtocol
from .spec import ProbeSpec

Job = tuple[ProbeSpec, str]  # (spec, role)


@dataclass(frozen=True)
class ProbeLimits:
    """What the budget allows one probe (planner/budget.py decides both): `left_s`, the seconds left of the budget
    for it (ProbeSpec.budget_left_s; None: no budget), and `max_time_s`, the most its protocol may measure (None:
    the protocol's own)."""

    left_s: float | None = None
    max_time_s: float | None = None

    def protocol(self, protocol: MeasureProtocol) -> MeasureProtocol:
        """`protocol` measuring at most `max_time_s`, never below its own min_time_s."""
        cap = protocol.max_time_s if self.max_time_s is None else min(protocol.max_time_s, self.max_time_s)
        cap = max(protocol.min_time_s, cap)
        return protocol if cap == protocol.max_time_s else dataclasses.replace(protocol, max_time_s=cap)


# (probe id, settings, role, the budget's limits for it) -> the spec to run
SpecMaker = Callable[[str, dict[str, Any], str, ProbeLimits], ProbeSpec]


@runtime_checkable
class ProbeBackend(Protocol):
    """Where probes run.

    `width`: how many probes it runs at once. From 2, the Session hands independent probes (the grid) to `many`
    together; at 1 it runs them in turn, checking the budget between them.
    `can_pair`: whether `pair` measures two probes together in lockstep (probe/lockstep.py). A backend that cannot
    (DDP probes, Ray) says False, and its `pair` raises NotImplementedError: the Session and the gate ask
    `can_pair` first and otherwise run a pair's two sides one after the other.
    `pair_memory_bytes`: the memory the two sides of a pair may use between them; None: no limit to respect.
    `fresh_parent_s`: the seconds a probe with `ProbeSpec.fresh_parent` takes beyond others (its new parent's start).
    """

    @property
    def width(self) -> int: ...

    @property
    def can_pair(self) -> bool: ...

    @property
    def pair_memory_bytes(self) -> int | None: ...

    @property
    def fresh_parent_s(self) -> float: ...

    def run(self, spec: ProbeSpec, role: str) -> ProbeResult:
        """Run one probe and return its result (a failed probe is a result with its status, not an exception)."""
        ...

    def pair(self, specs: list[ProbeSpec], roles: list[str], first: int) -> list[ProbeResult]:
        """Two probes in lockstep, step by step; `first` is the side that moves first. Results in `specs` order.
        The caller gives both specs one protocol and one budget: the pair measures, and ends, as one."""
        ...

    def many(self, jobs: list[Job]) -> Iterator[ProbeResult]:
        """Independent probes, all submitted now; yields each result as it finishes, in any order."""
        ...

    def close(self) -> None:
        """Release what the backend holds (a Ray instance it started); no probe runs after it."""
        ...


def bare_spec(probe_id: str, settings: dict[str, Any], role: str, limits: ProbeLimits) -> ProbeSpec:
    """A spec of the id, the settings and the budget left only: what a backend that measures nothing needs (the
    Session's default; the tests' fake backend)."""
    return ProbeSpec(id=probe_id, workload="", settings=settings, budget_left_s=limits.left_s)
