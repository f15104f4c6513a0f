"""A probe child started as a new Python process, a quiet wait on a descriptor, and what a launcher of a probe of
several processes gives the runner (a leaf: the runner and the torchrun launcher build on it)."""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

# The child's entry, above probe/, script/ and distributed/ (it picks the driver for the spec): the process
# machinery names it, as `python -m` does, and imports nothing of it.
CHILD_MODULE = "tune_advisor.child"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
DIE_WITH = "TUNE_ADVISOR_DIE_WITH"  # a new child's parent pid, where it is to die with it (`die_with_parent`)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent `parent` exits, however it exits (Linux; elsewhere
    nothing). A probe paused by SIGSTOP (a lockstep pair's waiting side) acts on no signal but SIGKILL and polls no
    pipe, so nothing else ends it once the process that would have resumed or killed it is gone (issue 63: one
    stayed stopped, reparented to init, for 38 minutes). The kernel sends the signal when the *thread* that forked
    this process ends: ask only where that thread lives as long as its process. Exits at once if `parent` has
    gone already."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)


_forker: list = [0, False]  # the pid that forks, and whether from its main thread (set just before each fork)


def children_die_with_this() -> None:
    """Every process this one forks from its main thread from now on (a probe child's loader workers) dies with it
    (`die_with_parent`): a worker paused with its probe outlives a killed probe otherwise."""
    def note() -> None:
        _forker[:] = [os.getpid(), threading.current_thread() is threading.main_thread()]

    def follow() -> None:
        if _forker[1]:
            die_with_parent(_forker[0])

    os.register_at_fork(before=note, after_in_child=follow)


class Spawned:
    """A child started as a new Python process (`python -m tune_advisor.child`)."""

    def __init__(self, python: str, argv: list[str], log_path: Path, env: dict[str, str]):
        if threading.current_thread() is threading.main_thread():  # see die_with_parent: a thread's end would kill it
            env = {**env, DIE_WITH: str(os.getpid())}
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
