"""How a probe child's run becomes its result file: the phase notes, a driver's run made a result (a failure made a
status), and the file written whole. The child's entry (tune_advisor/child.py) picks the driver.

The result is written atomically; the parent classifies a missing one (signal, hard exit) itself. While the child
works, it writes what it is doing to RESULT.json.phase so that a probe killed at its time limit can say where it
was stuck. Nothing torch-heavy is imported at the top (see `measure`).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable

from ..files import write_text_atomic
from .result import Status
from .spec import ProbeSpec

# A driver fills the result `out` for the spec, raising on a failure: probe/training.py's `train`, script mode's.
Driver = Callable[[ProbeSpec, Callable[[str], None], dict[str, Any], Path | None], None]


class Phase:
    """Writes the current phase next to the result file (read by the parent on a timeout)."""

    def __init__(self, result_path: Path):
        self.path = result_path.with_name(result_path.name + ".phase")
        self.last = ""  # for a timeout the child finds itself (a hung loader: measure.LoaderHung)

    def __call__(self, text: str) -> None:
        self.last = text
        try:
            self.path.write_text(text)
        except OSError:
            pass  # a phase note is a courtesy; it must never fail the probe


def write_result(path: Path, data: dict) -> None:
    """The result file, written whole (files.py), non-finite figures as null."""
    write_text_atomic(path, json.dumps(_finite(data), allow_nan=False, default=str))


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such figures (a noise that could not be computed) are written as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def measure(spec: ProbeSpec, phase: Callable[[str], None], driver: Driver, workdir: Path | None = None
            ) -> dict[str, Any]:
    """Run `driver` for `spec` and return the result it filled; never raises (a failure is a status). A profiler
    trace goes to `workdir`. The driver imports its modules when called: after this clock starts."""
    started = time.perf_counter()
    # Imported once the clock runs: these modules import torch, which outside the zygote (a torchrun rank) takes
    # seconds that child_wall_s has always counted.
    from . import evidence, failure, measure as core, training

    out: dict[str, Any] = {"status": Status.OK.value, "error": None, "raw": evidence.empty_raw(), "applied": {},
                           "extra": {}}
    try:
        driver(spec, phase, out, workdir)
    except training.Diverged as exc:
        out["status"], out["error"] = Status.DIVERGED.value, str(exc)
    except core.LoaderHung as exc:  # as a probe past its limit ends: a timeout, with where it was
        where = getattr(phase, "last", "")
        out["status"], out["error"] = Status.TIMEOUT.value, str(exc) + (f" (last phase: {where})" if where else "")
    except SystemExit as exc:
        out["status"], out["error"] = Status.ERROR.value, f"the workload called sys.exit({exc.code})"
    except BaseException as exc:  # noqa: BLE001 — any failure of user code is a probe outcome
        status, message = failure.classify(exc, Path(spec.workload), spec.settings)
        out["status"], out["error"] = status.value, message
    out["extra"]["child_wall_s"] = time.perf_counter() - started
    if "memory" not in out:  # a probe that got through its measured steps took its peaks then
        out["memory"] = evidence.memory_peaks(spec.device)
    return out
