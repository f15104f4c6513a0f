"""The probe child process's entry: `python -m tune_advisor.child SPEC.json RESULT.json`, or `main` in a child
forked by probe/zygote.py. It picks the driver for the spec and leaves RESULT.json behind (probe/outcome.py):

    inspect  a workload file: probe/inspection.py; a plain script: script/driver.py `inspect`
    probe    a workload file: probe/training.py; a Trainer or LightningModule: its own loop, probe/loop.py; a plain
             script: script/driver.py `train`; a torchrun rank joins its DDP group first and plugs it into the
             training (distributed/rank.py), a framework's too (its adapted parts in probe/training.py's loop);
             a script's rank does not: the script joins its group itself (rank.ScriptRank)

It sits above probe/, script/ and distributed/, so that each of those imports only downward; the process machinery
names it (probe/process.py CHILD_MODULE) and imports nothing of it. Nothing torch-heavy is imported at the top:
the drivers are imported once the child's clock runs (outcome.measure).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

from .probe.outcome import Phase, measure, write_result
from .probe.process import DIE_WITH, children_die_with_this, die_with_parent
from .probe.spec import ProbeSpec


def main(argv: list[str]) -> int:
    children_die_with_this()  # loader workers paused with this probe must not outlive it
    spec = ProbeSpec.from_json(Path(argv[0]).read_text())
    # absolute: a script probe runs in a folder of its own (script/mirror.py), and a relative path (`analyze -o
    # reports/x` run where the script's folder is) would then write the phase notes there, listed as the script's
    result_path = Path(argv[1]).absolute()
    phase = Phase(result_path)
    if spec.mode == "inspect":
        result = inspect(spec, phase)
    else:
        result = train_and_measure(spec, phase, workdir=result_path.parent)
    if spec.distributed and spec.mode == "probe":  # a torchrun rank: rank 0 writes the job's merged result
        from .distributed import rank

        return rank.finish(result, result_path, write_result)
    write_result(result_path, result)
    return 0


def inspect(spec: ProbeSpec, phase: Callable[[str], None]) -> dict[str, Any]:
    """Inspect mode: the workload's facts, or its load error."""
    if spec.script is not None:
        from .script.driver import inspect as inspect_script  # not at the top: torch loads here

        return inspect_script(spec, phase)
    from .probe.inspection import inspect_workload

    return inspect_workload(spec, phase)


def train_and_measure(spec: ProbeSpec, phase: Callable[[str], None], workdir: Path | None = None) -> dict[str, Any]:
    """Train and time one configuration with the spec's driver; never raises (a failure is a status)."""
    return measure(spec, phase, drive, workdir)


def drive(spec: ProbeSpec, phase: Callable[[str], None], out: dict[str, Any], workdir: Path | None) -> None:
    """The spec's driver, imported here: once outcome.measure's clock runs."""
    from .probe import apply

    apply.share_compile_headers()  # the user's own torch.compile too (script mode, a Trainer's, Lightning's)
    if spec.script is not None:  # script mode: the user's script drives the steps
        from .script import driver

        script_rank = None
        if spec.distributed:  # a torchrun rank of a script that joins its group itself
            from .distributed import rank

            script_rank = rank.setup_script(spec)
        driver.train(spec, phase, out, workdir, script_rank)
        return
    from .probe import training

    group = None
    if spec.distributed:  # a torchrun rank joins its group before it builds anything
        from .distributed import rank

        group = rank.setup(spec)
    wl = training.load(spec, phase, out)
    if wl.loop is not None and group is None:  # a Trainer or LightningModule: measured through its own loop
        from .probe import loop

        loop.train(spec, phase, out, workdir, wl)
        return
    training.train(spec, phase, out, workdir, group, wl)


if __name__ == "__main__":
    if DIE_WITH in os.environ:  # started as a new process (probe/process.py Spawned), not forked by a zygote
        die_with_parent(int(os.environ.pop(DIE_WITH)))
    sys.exit(main(sys.argv[1:]))
