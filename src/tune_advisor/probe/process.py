"""A probe child started as a new Python process, a quiet wait on a descriptor, and what a launcher of a probe of
several processes gives the runner (a leaf: the runner and the torchrun launcher build on it)."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

# The child's entry, above probe/, script/ and distributed/ (it picks the driver for the spec): the process
# machinery names it, as `python -m` does, and imports nothing of it.
CHILD_MODULE = "tune_advisor.child"


class Spawned:
    """A child started as a new Python process (`python -m tune_advisor.child`)."""

    def __init__(self, python: str, argv: list[str], log_path: Path, env: dict[str, str]):
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [python, "-m", CHILD_MODULE, *argv],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,  # its own process group: loader workers die with it
            )
        self.pid = self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def wait_until(self, deadline: float) -> bool:
        """Block until the child exits (True) or the monotonic `deadline` passes (False), without waking meanwhile.

        The parent must stay quiet: on a 2-core machine every wake-up of ours preempts one of the probe's compute
        threads, and Popen.wait(timeout)'s polling loop (tens of wake-ups a second) cost probes several percent.
        A pidfd becomes readable when the process exits, so select() sleeps until then.
        """
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3: fall back to polling
            try:
                self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                return True
            except subprocess.TimeoutExpired:
                return False
        try:
            if sleep_until_readable(pidfd, deadline):
                self.proc.wait()
                return True
            return self.proc.poll() is not None
        finally:
            os.close(pidfd)

    def wait(self) -> None:
        self.proc.wait()


class NotStarted:
    """A probe whose new parent (a zygote importing torch) was not ready by the probe's deadline: no child ran, and
    the probe ends as one that ran out of time (the budget holds that start too)."""

    pid = None
    returncode = None

    def wait_until(self, deadline: float) -> bool:
        return False

    def wait(self) -> None:
        pass


def sleep_until_readable(fd: int, deadline: float) -> bool:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            return True


class Launcher(Protocol):
    """How a probe of several processes starts, and why its job failed when it left no result. The runner is handed
    one for a distributed probe (distributed/launch.py's TORCHRUN) and imports none."""

    def start(self, python: str, layout: dict[str, Any], argv: list[str], log_path: Path, env: dict[str, str],
              run_id: str) -> Spawned: ...

    def failure(self, result_path: Path, log_tail: str) -> tuple[str, str] | None: ...
