"""Runs inside the probe child process: read the spec, run its mode (inspect, or train and measure), write the result.

Invoked as `python -m tune_advisor.probe.child SPEC.json RESULT.json`. Always tries to leave RESULT.json behind
(written atomically); the parent classifies a missing one (signal, hard exit) itself. While it works, the child
writes what it is doing to RESULT.json.phase so that a probe killed at its time limit can say where it was stuck.

The work lives in modules of its own, imported once a mode runs (see train_and_measure): inspection.py (inspect
mode), training.py (the training loop), window.py (when measuring stops), evidence.py (what is recorded),
extra_steps.py (collectors that run steps of their own), failure.py (how a failure is named).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from ..files import write_text_atomic
from .result import Status
from .spec import ProbeSpec


class Phase:
    """Writes the current phase next to the result file (read by the parent on a timeout)."""

    def __init__(self, result_path: Path):
        self.path = result_path.with_name(result_path.name + ".phase")

    def __call__(self, text: str) -> None:
        try:
            self.path.write_text(text)
        except OSError:
            pass  # a phase note is a courtesy; it must never fail the probe


def main(argv: list[str]) -> int:
    spec = ProbeSpec.from_json(Path(argv[0]).read_text())
    result_path = Path(argv[1])
    phase = Phase(result_path)
    if spec.mode == "inspect" and spec.script is not None:
        from ..script.driver import inspect as inspect_script  # not at the top: see train_and_measure

        result = inspect_script(spec, phase)
    elif spec.mode == "inspect":
        from .inspection import inspect_workload  # not at the top: torch loads here (see train_and_measure)

        result = inspect_workload(spec, phase)
    else:
        result = train_and_measure(spec, phase, workdir=result_path.parent)
    if spec.distributed and spec.mode == "probe":  # a torchrun rank: rank 0 writes the job's merged result
        from ..distributed import rank as ddp_rank  # not at the top: see train_and_measure

        return ddp_rank.finish(result, result_path, write_result)
    write_result(result_path, result)
    return 0


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


def train_and_measure(spec: ProbeSpec, phase: Phase, workdir: Path | None = None) -> dict[str, Any]:
    """Train and time one configuration; never raises (a failure is a status). A profiler trace goes to `workdir`."""
    started = time.perf_counter()
    # Imported once the clock runs: these modules import torch, which outside the zygote (a torchrun rank) takes
    # seconds that child_wall_s has always counted. So this module imports nothing torch-heavy at its top.
    from . import evidence, failure, training

    run = training.train
    if spec.script is not None:  # script mode: the user's script drives the steps
        from ..script import driver as script_driver

        run = script_driver.train

    out: dict[str, Any] = {"status": Status.OK.value, "error": None, "raw": evidence.empty_raw(), "applied": {},
                           "extra": {}}
    try:
        run(spec, phase, out, workdir)
    except training.Diverged as exc:
        out["status"], out["error"] = Status.DIVERGED.value, str(exc)
    except SystemExit as exc:
        out["status"], out["error"] = Status.ERROR.value, f"the workload called sys.exit({exc.code})"
    except BaseException as exc:  # noqa: BLE001 — any failure of user code is a probe outcome
        status, message = failure.classify(exc, Path(spec.workload), spec.settings)
        out["status"], out["error"] = status.value, message
    out["extra"]["child_wall_s"] = time.perf_counter() - started
    if "memory" not in out:  # a probe that got through its measured steps took its peaks then
        out["memory"] = evidence.memory_peaks(spec.device)
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
