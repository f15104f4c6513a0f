"""Nothing left behind (issue 63, part 5): the process that runs probes is ended by SIGTERM or SIGKILL, alone or with
its process group (as `timeout` and CI runners end a job), during a lockstep pair, a zygote's start or a probe's
result write; afterwards no process of the run is left, stopped or not, and no half-written `.tmp` file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from ..conftest import WORKLOADS, tagged_processes

# The main process of each case: a lockstep pair, or one probe, of a tiny workload that would run for minutes.
MAIN = """
import sys
from pathlib import Path
from tune_advisor import knobs
from tune_advisor.probe import lockstep, runner
from tune_advisor.probe.spec import ProbeSpec, Protocol

workload, workdir, moment = sys.argv[1:]
long = Protocol(warmup_steps=1, min_steps=100000, min_time_s=600, max_steps=100000, max_time_s=600)
if moment == "result write":  # a short probe: its result write comes soon (and hangs there)
    long = Protocol(warmup_steps=1, min_steps=3, min_time_s=0.1, max_steps=10, max_time_s=1.0)
settings = knobs.full_settings({"batch_size": 32, "num_workers": 2 if moment == "pair" else 0})
specs = [ProbeSpec(id=f"p00{i}", workload=workload, settings=settings, protocol=long, timeout_s=600)
         for i in (1, 2)]
if moment == "pair":
    lockstep.run_pair(specs, Path(workdir), ["a", "b"])
else:
    runner.run_probe(specs[0], Path(workdir))
"""
# tiny_mlp, whose probe then hangs inside the fsync of its result's temporary file: killed while writing it.
SLOW_WRITE = (WORKLOADS / "tiny_mlp.py").read_text() + '''

import os as _os
import time as _time

_fsync = _os.fsync


def _hang_in_the_result_write(fd):
    if _os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
        _time.sleep(600)
    _fsync(fd)


_os.fsync = _hang_in_the_result_write
'''
KILLS = {"SIGTERM to the main process": (signal.SIGTERM, False), "SIGTERM to its group": (signal.SIGTERM, True),
         "SIGKILL to the main process": (signal.SIGKILL, False), "SIGKILL to its group": (signal.SIGKILL, True)}


def _none_left(tag: str, wait_s: float = 10.0) -> bool:
    """Whether the run's processes are all gone within `wait_s`: a zygote ends its child when it sees its parent
    go, which takes a moment."""
    deadline = time.monotonic() + wait_s
    while tagged_processes(tag):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _stopped(tag: str) -> bool:
    """Whether a process of the run is paused (a lockstep pair's waiting side, with its loader workers)."""
    for p in tagged_processes(tag):
        try:
            if p.status() == psutil.STATUS_STOPPED:
                return True
        except psutil.Error:
            continue
    return False


def _zygote_starting(tag: str) -> bool:
    for p in tagged_processes(tag):
        try:
            if "tune_advisor.probe.zygote" in p.cmdline():
                return True
        except psutil.Error:
            continue
    return False


# SIGTERM and SIGKILL to the main process at each moment, and a SIGTERM to the whole group (as `timeout` and CI
# runners send it) during a pair: the case that left a paused side stopped for 38 minutes. The other group kills
# take the same paths (tested once each in development; each case costs a run's start, ~6 s).
MAIN_KILLS = ("SIGTERM to the main process", "SIGKILL to the main process")
CASES = [(moment, kill) for moment in ("pair", "zygote start", "result write") for kill in MAIN_KILLS]
CASES.append(("pair", "SIGTERM to its group"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux's")
@pytest.mark.parametrize("moment, kill", CASES)
def test_a_run_ended_by_a_signal_leaves_no_process_and_no_temporary_file(tmp_path, moment, kill):
    _end_run(tmp_path, moment, kill, zygote=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux's")
@pytest.mark.parametrize("kill", ["SIGKILL to the main process", "SIGTERM to its group"])
def test_a_pair_of_new_processes_ended_by_a_signal_leaves_none(tmp_path, kill):
    _end_run(tmp_path, "pair", kill, zygote=False)  # TUNE_ADVISOR_NO_ZYGOTE: each probe a new Python process


def _end_run(tmp_path, moment: str, kill: str, zygote: bool) -> None:
    """GIVEN a run at `moment`, WHEN it gets `kill`, THEN nothing of it is left."""
    # GIVEN a run (tagged, in a process group of its own) at the moment named
    workload = WORKLOADS / "tiny_io.py"
    if moment == "result write":
        workload = tmp_path / "slow_write.py"
        workload.write_text(SLOW_WRITE)
    workdir = tmp_path / "probes"
    tag = uuid.uuid4().hex
    env = {**os.environ, "TUNE_ADVISOR_TEST_TAG": tag}
    env.pop("TUNE_ADVISOR_NO_ZYGOTE", None)
    if not zygote:
        env["TUNE_ADVISOR_NO_ZYGOTE"] = "1"
    main = subprocess.Popen([sys.executable, "-c", MAIN, str(workload), str(workdir), moment], env=env,
                            start_new_session=True, stderr=subprocess.PIPE)
    there = {"pair": lambda: _stopped(tag), "zygote start": lambda: _zygote_starting(tag),
             "result write": lambda: any(workdir.glob("*.tmp"))}[moment]
    try:
        deadline = time.monotonic() + 60
        while not there() and main.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert main.poll() is None and there(), f"the run never got to the {moment}"
        # WHEN its main process (or its whole group) gets the signal
        signum, group = KILLS[kill]
        os.killpg(main.pid, signum) if group else main.send_signal(signum)
        main.communicate(timeout=60)
        # THEN it ended by that signal, and nothing of the run is left: no process (stopped or not), no
        # temporary file
        assert main.returncode == -signum
        assert _none_left(tag), [(p.cmdline(), p.status()) for p in tagged_processes(tag)]
        if (signum, group) != (signal.SIGKILL, True):  # then nothing of the run lives to remove a half-written
            assert not list(workdir.rglob("*.tmp"))  # result: the next run into the folder does (rundir.py)
    finally:  # a failing case must not leave its run behind either
        for p in tagged_processes(tag):
            p.kill()
