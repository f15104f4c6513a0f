"""Spawns one probe child, enforces its wall-clock limit, samples its memory, and classifies how it ended."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from ..collectors.memory import TreeMemorySampler
from .result import ProbeResult, Status
from .spec import ProbeSpec

SIGNAL_NAMES = {signal.SIGSEGV: "SIGSEGV (segmentation fault)", signal.SIGABRT: "SIGABRT (abort)",
                signal.SIGBUS: "SIGBUS (bus error)", signal.SIGFPE: "SIGFPE (arithmetic fault)",
                signal.SIGILL: "SIGILL (illegal instruction)", signal.SIGKILL: "SIGKILL"}
# A child killed by SIGKILL that we did not send, with its memory near the machine's total, met the OOM killer.
OOM_KILLER_FRACTION = 0.85


class ChildRun:
    """One finished child process: how it exited and what it left behind."""

    def __init__(self, returncode: int | None, result: dict | None, timed_out: bool, peak_bytes: int,
                 killed: int, phase: str, log_tail: str, wall_s: float):
        self.returncode, self.result, self.timed_out = returncode, result, timed_out
        self.peak_bytes, self.killed, self.phase, self.log_tail, self.wall_s = (
            peak_bytes, killed, phase, log_tail, wall_s)


def spawn_child(spec: ProbeSpec, workdir: Path, python: str = sys.executable) -> ChildRun:
    """Run `tune_advisor.probe.child` for `spec` in its own session (= process group) and wait for it."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / f"{spec.id}.spec.json"
    result_path = workdir / f"{spec.id}.result.json"
    phase_path = result_path.with_name(result_path.name + ".phase")
    log_path = workdir / f"{spec.id}.log"
    for stale in (result_path, phase_path):
        stale.unlink(missing_ok=True)
    spec_path.write_text(spec.to_json())
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1")
    # The child imports tune_advisor from wherever this process found it, installed or not.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)

    child = start_child(python, [str(spec_path), str(result_path)], log_path, env)
    started = time.monotonic()
    sampler = TreeMemorySampler(child.pid)
    sampler.start()
    timed_out, killed = False, 0
    try:
        if not child.wait_until(started + spec.timeout_s):
            timed_out = True
            killed = kill_group(child.pid)
            child.wait()
    except BaseException:  # Ctrl-C or any error here: leave nothing running behind us
        kill_group(child.pid)
        child.wait()
        raise
    finally:
        sampler.stop()
        # Workers can outlive a crashed child; the group is killed either way.
        kill_group(child.pid)
    wall = time.monotonic() - started

    result = None
    if result_path.exists():
        try:
            result = json.loads(result_path.read_text())
        except json.JSONDecodeError:
            result = None
    phase = phase_path.read_text() if phase_path.exists() else ""
    return ChildRun(child.returncode, result, timed_out, sampler.peak_bytes, killed, phase,
                    _tail(log_path), wall)


class Spawned:
    """A child started as a new Python process (`python -m tune_advisor.probe.child`)."""

    def __init__(self, python: str, argv: list[str], log_path: Path, env: dict[str, str]):
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [python, "-m", "tune_advisor.probe.child", *argv],
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
            if _sleep_until_readable(pidfd, deadline):
                self.proc.wait()
                return True
            return self.proc.poll() is not None
        finally:
            os.close(pidfd)

    def wait(self) -> None:
        self.proc.wait()


class Forked:
    """A child forked by the zygote (probe/zygote.py), which has torch imported already."""

    def __init__(self, zygote: "Zygote", argv: list[str], log_path: Path, env: dict[str, str]):
        self.zygote = zygote
        self.pid = zygote.request({"argv": argv, "log": str(log_path), "env": env})["pid"]
        self.returncode: int | None = None

    def wait_until(self, deadline: float) -> bool:
        # The zygote reports the exit the moment it reaps the child: sleep on its reply pipe, like on a pidfd.
        if not _sleep_until_readable(self.zygote.replies, deadline):
            return False
        self.wait()
        return True

    def wait(self) -> None:
        if self.returncode is None:
            self.returncode = self.zygote.reply()["exitcode"]


class Zygote:
    """The long-lived pre-warmed parent of probe children; one per environment, started on first use."""

    def __init__(self, python: str, env: dict[str, str]):
        self.python, self.env = python, env
        self.proc = subprocess.Popen([python, "-m", "tune_advisor.probe.zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, bufsize=0)
        self.replies = self.proc.stdout.fileno()
        if not self.reply().get("ready"):
            raise OSError("the zygote did not start")

    def request(self, message: dict) -> dict:
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()
        return self.reply()

    def reply(self) -> dict:
        line = self.proc.stdout.readline()  # unbuffered: never reads past the line, so select() stays exact
        if not line:
            raise OSError("the zygote exited")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


_zygote: Zygote | None = None


def start_child(python: str, argv: list[str], log_path: Path, env: dict[str, str]) -> Spawned | Forked:
    """Fork the child from the zygote (started, or restarted when the environment changed, as needed); a new
    process when TUNE_ADVISOR_NO_ZYGOTE is set or the zygote cannot start."""
    global _zygote
    if os.environ.get("TUNE_ADVISOR_NO_ZYGOTE") or not hasattr(os, "fork"):
        return Spawned(python, argv, log_path, env)
    for _ in range(2):  # a zygote that died (killed from outside) is replaced once
        try:
            if _zygote is None or _zygote.env != env or _zygote.python != python or _zygote.proc.poll() is not None:
                if _zygote is not None:
                    _zygote.close()
                _zygote = None
                _zygote = Zygote(python, env)
            return Forked(_zygote, argv, log_path, env)
        except (OSError, ValueError):
            _zygote = None
    return Spawned(python, argv, log_path, env)


def _sleep_until_readable(fd: int, deadline: float) -> bool:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            return True


def kill_group(pgid: int) -> int:
    """SIGKILL every process in the group `pgid`; returns how many were alive."""
    members = 0
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                members += 1
        except (ProcessLookupError, PermissionError):
            continue
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return members


def run_probe(spec: ProbeSpec, workdir: Path, role: str = "") -> ProbeResult:
    """Run one probe child and turn however it ended into a ProbeResult."""
    run = spawn_child(spec, workdir)
    res = run.result or {}
    result = ProbeResult(
        id=spec.id, settings=dict(spec.settings), status=Status(res.get("status", Status.CRASHED.value)),
        error=res.get("error"), raw=res.get("raw") or {}, unit=res.get("unit", "samples/s"),
        applied=res.get("applied") or {}, extra=res.get("extra") or {}, gpu=res.get("gpu"),
        wall_s=run.wall_s, role=role, seed=spec.seed,
    )
    memory = dict(res.get("memory") or {})
    memory["sampled_tree_peak_bytes"] = run.peak_bytes
    result.memory = memory
    result.peak_memory_bytes = peak_memory(memory, spec.device)

    if run.timed_out:
        result.status = Status.TIMEOUT
        where = f" (last phase: {run.phase})" if run.phase else ""
        result.error = (f"no result within the {spec.timeout_s:g} s limit{where}; killed the probe's "
                        f"process group ({run.killed} process{'es' if run.killed != 1 else ''})")
    elif run.result is None:
        result.status, result.error = classify_exit(run, spec)
    return result


def classify_exit(run: ChildRun, spec: ProbeSpec) -> tuple[Status, str]:
    """Why a child left no result: a signal, the OOM killer, or a hard exit."""
    where = f" during: {run.phase}" if run.phase else ""
    rc = run.returncode
    if rc is not None and rc < 0:
        sig = -rc
        if sig == signal.SIGKILL and run.peak_bytes > OOM_KILLER_FRACTION * psutil.virtual_memory().total:
            return Status.OOM, (f"killed by the kernel's OOM killer at {run.peak_bytes / 2**30:.1f} GiB "
                                f"resident{where}")
        name = SIGNAL_NAMES.get(sig, f"signal {sig}")
        frame = _user_frame_from_log(run.log_tail, spec.workload)
        return Status.CRASHED, f"killed by {name}{where}{frame}"
    return Status.CRASHED, f"exited with code {rc} without a result{where}" + (
        f"; output ends: {run.log_tail.strip().splitlines()[-1][:200]}" if run.log_tail.strip() else "")


def _user_frame_from_log(log_tail: str, workload: str) -> str:
    """faulthandler prints the Python stack on a fatal signal: point at the innermost line in the user's file."""
    name = Path(workload).name
    for line in log_tail.splitlines():
        if name in line and "line" in line:
            return f" at {name}:{line.split('line')[-1].split()[0].strip(',')}"
    return ""


def peak_memory(memory: dict[str, Any], device: str) -> int | None:
    """CUDA: the allocator peak. CPU: the larger of the sampled tree RSS and the child's own exact maxrss."""
    if device.startswith("cuda") and "cuda_max_allocated_bytes" in memory:
        return memory["cuda_max_allocated_bytes"]
    candidates = [memory.get("sampled_tree_peak_bytes") or 0, memory.get("child_maxrss_bytes") or 0]
    return max(candidates) or None


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
