"""`ProbeBackend`: the one interface through which the planner's Session has probes run.

The Session numbers probes and decides what to run; a `SpecMaker` (analyze's: api/facade.py ProbeSpecs) turns each
(probe id, settings, role, budget left) into a ProbeSpec; the backend runs specs and hands back ProbeResults. The
backends are in executors/ (local, torchrun, Ray); tests/fakes.py's FakeBackend synthesises results instead.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, runtime_checkable

from .result import ProbeResult
from .spec import ProbeSpec

Job = tuple[ProbeSpec, str]  # (spec, role)
# (probe id, settings, role, seconds left of the budget for it or None) -> the spec to run
SpecMaker = Callable[[str, dict[str, Any], str, float | None], ProbeSpec]


@runtime_checkable
class ProbeBackend(Protocol):
    """Where probes run.

    `width`: how many probes it runs at once. From 2, the Session hands independent probes (the grid) to `many`
    together; at 1 it runs them in turn, checking the budget between them.
    `can_pair`: whether `pair` measures two probes together in lockstep (probe/lockstep.py). A backend that cannot
    (DDP probes, Ray) says False, and its `pair` raises NotImplementedError: the Session asks `can_pair` first and
    otherwise runs a duel's two sides one after the other.
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
        """Two probes in lockstep, step by step; `first` is the side that moves first. Results in `specs` order."""
        ...

    def many(self, jobs: list[Job]) -> Iterator[ProbeResult]:
        """Independent probes, all submitted now; yields each result as it finishes, in any order."""
        ...

    def close(self) -> None:
        """Release what the backend holds (a Ray instance it started); no probe runs after it."""
        ...


def bare_spec(probe_id: str, settings: dict[str, Any], role: str, left_s: float | None) -> ProbeSpec:
    """A spec of the id, the settings and the budget left only: what a backend that measures nothing needs (the
    Session's default; the tests' fake backend)."""
    return ProbeSpec(id=probe_id, workload="", settings=settings, budget_left_s=left_s)
