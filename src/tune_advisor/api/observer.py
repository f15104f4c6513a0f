"""What `analyze` tells its caller while it runs: an `AnalysisObserver` (the CLI's live output is one)."""

from __future__ import annotations

from typing import Any, Protocol

from ..planner import Session
from ..probe.result import ProbeResult
from .inspection import Inspection


class AnalysisObserver(Protocol):
    """Hears how an analysis goes, from the thread that runs it (SilentObserver: a base hearing only some of it)."""

    def on_start(self, info: Inspection, session: Session) -> None:
        """The workload is inspected and the plan begins."""

    def on_probe_start(self, probe_id: str, settings: dict[str, Any], role: str) -> None:
        """A probe is about to run (not for probes a resumed run reuses)."""

    def on_probe(self, result: ProbeResult, session: Session) -> None:
        """A probe finished and is recorded (reused ones too)."""

    def on_notice(self, message: str) -> None:
        """A message for the user about the run itself (resuming)."""


class SilentObserver:
    """Hears everything, says nothing: the default, and a base for observers that need only some of it."""

    def on_start(self, info: Inspection, session: Session) -> None:
        pass

    def on_probe_start(self, probe_id: str, settings: dict[str, Any], role: str) -> None:
        pass

    def on_probe(self, result: ProbeResult, session: Session) -> None:
        pass

    def on_notice(self, message: str) -> None:
        pass
