"""Spawns one probe child, enforces its wall-clock limit, samples its memory, and classifies how it ended."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from .. import environment
from ..collectors.memory import TreeMemorySampler
from .result import ProbeResult, Status
from .process import Launcher, NotStarted, Spawned, sleep_until_readable
from .spec import ProbeSpec

SIGNAL_NAMES = {signal.SIGSEGV: "SIGSEGV (segmentation fault)", signal.SIGABRT: "SIGABRT (abort)",
                signal.SIGBUS: "SIGBUS (bus error)", signal.SIGFPE: "SIGFPE (arithmetic fault)",
                signal.SIGILL: "SIGILL (illegal instruction)", signal.SIGKILL: "SIGKILL"}
# A child killed by SIGKILL that we did not send, with its memory near the machine's total, met the OOM killer.
OOM_KILLER_FRACTION = 0.85


class ChildRun:
    """One finished child process: how it exited and what it left behind."""

    def __init__(self, returncode: int | None, result: dict | None, timed_out: bool, peak_bytes: int,
                 killed: int, phase: str, log_tail: str, wall_s: float, rss_sum_peak_bytes: int | None = None,
                 peak_counts: str | None = None, smaps_unreadable: str | None = None, began: bool = True,
                 budget_ended: bool = False):
        self.returncode, self.result, self.timed_out = returncode, result, timed_out
        self.budget_ended = budget_ended  # timed out where the budget's end, not the probe's own limit, came first
        self.peak_bytes, self.killed, self.phase, self.log_tail, self.wall_s = (
            peak_bytes, killed, phase, log_tail, wall_s)
        # peak_bytes: the sampled tree's peak with pages shared by forked workers counted once (where smaps_rollup
        # is readable; `peak_counts` says how it was counted); rss_sum_peak_bytes: every process's RSS summed.
        self.rss_sum_peak_bytes, self.peak_counts = rss_sum_peak_bytes, peak_counts
        self.smaps_unreadable = smaps_unreadable  # why the peak is the summed RSS, where it is
        self.began = began  # False: its new parent was not ready by the deadline, and no child ran


class Started:
    """A running probe child (`start_probe`) until `finish_probe` or `wait_child` waits for it."""

    def __init__(self, spec: ProbeSpec, workdir: Path, role: str, child, result_path: Path, log_path: Path,
                 scratch: Path, started: float, launcher: Launcher | None = None, budget_end: float = math.inf):
        self.spec, self.workdir, self.role, self.child, self.launcher = spec, workdir, role, child, launcher
        self.result_path, self.log_path, self.scratch = result_path, log_path, scratch
        self.pid = child.pid  # also its process group: the child leads a session of its own
        self.started = started
        # budget_end: when the budget's share for it ends, counted from the asking (start_probe)
        self.deadline = min(self.started + spec.limit_s, budget_end)
        self.budget_ends_it = budget_end <= self.started + spec.limit_s  # not the probe's own limit
        self.sampler = TreeMemorySampler(child.pid)
        if self.began:
            self.sampler.start()
        self.timed_out, self.killed = False, 0
        self.kill_sent = False  # killed by us already: a later deadline does not make it a timeout

    @property
    def began(self) -> bool:
        """Whether a child process was started (not so where its new parent missed the deadline: NotStarted)."""
        return self.pid is not None

    def kill(self, timed_out: bool = False) -> None:
        """SIGKILL the child's process group; `timed_out`: because its wall-clock limit passed."""
        self.kill_sent = True
        killed = kill_group(self.pid) if self.began else 0
        if timed_out and not self.timed_out:
            self.timed_out, self.killed = True, killed


def spawn_child(spec: ProbeSpec, workdir: Path, python: str = sys.executable) -> ChildRun:
    """Run the probe child (process.CHILD_MODULE) for `spec` in its own session (= process group) and wait for it."""
    return wait_child(start_probe(spec, workdir, python=python))


def start_probe(spec: ProbeSpec, workdir: Path, role: str = "", python: str = sys.executable,
                slot: int = 0, ready_by: float | None = None, launcher: Launcher | None = None) -> Started:
    """Start the child for `spec` in its own session (= process group) and return without waiting.

    `slot` picks the zygote: one forks one child at a time, so probes that run together need one each. A probe
    asking for a new parent waits for it until its own deadline, or `ready_by` if sooner (a lockstep pair's
    second side: the pair ends at its first side's deadline). A distributed probe is started by its `launcher`
    (distributed/launch.py's TORCHRUN, handed over by the backend)."""
    if spec.distributed and launcher is None:
        raise ValueError(f"probe {spec.id} is distributed: it needs a launcher (a TorchrunBackend's)")
    asked = time.monotonic()
    # what is left of the budget counts from the asking: a parent started for the probe must fit in it too (a
    # last probe of a 10 s budget, waiting 2.7 s for a new parent, ended the plan 0.15 s past the budget)
    budget_end = math.inf if spec.budget_left_s is None else asked + spec.budget_left_s
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / f"{spec.id}.spec.json"
    result_path = workdir / f"{spec.id}.result.json"
    phase_path = result_path.with_name(result_path.name + ".phase")
    log_path = workdir / f"{spec.id}.log"
    for stale in (result_path, phase_path):
        stale.unlink(missing_ok=True)
    spec_path.write_text(spec.to_json())
    env = _child_env()
    # The temporary files of the child and its loader workers go to a folder removed when it ends: a killed child,
    # or one ending by os._exit as zygote children do, cannot clean up after itself.
    # The folder's path stays short: multiprocessing puts AF_UNIX sockets there (loader workers hand tensors over
    # through them), and a socket path over 108 bytes fails to bind, leaving the workers stuck.
    sweep_scratch()
    env["TMPDIR"] = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-{spec.id}-", dir=scratch_base())

    if spec.distributed:  # the launcher (torchrun) runs the child on every rank; no zygote
        child = launcher.start(python, spec.distributed, [str(spec_path), str(result_path)], log_path, env, spec.id)
    else:
        if spec.fresh_parent and not _unused(slot):
            retire_zygote(slot)
        # a new parent's start counts against the probe (below), so the wait for it ends at the probe's deadline;
        # any parent's start (a zygote's first, or one for a new environment) ends where the budget does
        own_end = asked + spec.limit_s if spec.fresh_parent else math.inf
        ready_by = min(own_end, budget_end, math.inf if ready_by is None else ready_by)
        child = start_child(python, [str(spec_path), str(result_path)], log_path, env, slot,
                            None if ready_by == math.inf else ready_by, spec.preload)
        if isinstance(child, NotStarted):
            phase_path.write_text(NEW_PARENT_PHASE)
    # A probe that asked for a new parent (spec.fresh_parent) counts its start, seconds long, against its limit and
    # in its wall time: the start is its own, and the budget must hold it. Others begin when their child does (a
    # zygote's first start, or a restart for a new environment, is the process's, not one probe's).
    started = asked if spec.fresh_parent else time.monotonic()
    return Started(spec, workdir, role, child, result_path, log_path, Path(env["TMPDIR"]), started, launcher,
                   budget_end)


def _child_env() -> dict[str, str]:
    """The environment a probe child starts in, less its own TMPDIR (`start_probe` adds that)."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1")
    # The child imports tune_advisor from wherever this process found it, installed or not.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    # torch.compile's cache stays where it was (under the temporary folder by default), not in the probe's own.
    env["TORCHINDUCTOR_CACHE_DIR"] = environment.inductor_cache_dir()
    return env


SCRATCH_PREFIX = "ta-"  # then the pid of the process that started the probe, and the probe's id
_swept = False


def sweep_scratch() -> None:
    """Once per process: remove the probe scratch folders of tune-advisor processes that no longer run (killed
    with SIGKILL, or the machine lost power, before they could remove their own). A folder whose pid runs
    again (reused) is left for a later sweep."""
    global _swept
    if _swept:
        return
    _swept = True
    for folder in Path(scratch_base()).glob(SCRATCH_PREFIX + "*-*-*"):
        pid = folder.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        try:
            ours = folder.is_dir() and folder.stat().st_uid == os.getuid()
        except OSError:  # removed meanwhile
            continue
        if ours and pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def scratch_base() -> str:
    """Where probe scratch folders go: the temporary folder, unless its path is too long for the sockets
    multiprocessing creates under it (~50 more bytes, of the 108 an AF_UNIX path may have); then /tmp."""
    base = tempfile.gettempdir()
    return base if len(base) <= 48 else "/tmp"


def wait_child(run: Started) -> ChildRun:
    """Wait for a started child until it exits or its wall-clock limit passes (then kill its process group), and
    collect what it left behind."""
    child, result_path, log_path = run.child, run.result_path, run.log_path
    phase_path = result_path.with_name(result_path.name + ".phase")
    try:
        if not child.wait_until(run.deadline):
            run.kill(timed_out=not run.kill_sent)  # one killed already (a lockstep partner's) may still be dying
            child.wait()
    except BaseException:  # Ctrl-C or any error here: leave nothing running behind us
        run.kill()
        child.wait()
        raise
    finally:
        if run.began:
            run.sampler.stop()
            # Workers can outlive a crashed child; the group is killed either way.
            kill_group(child.pid)
        shutil.rmtree(run.scratch, ignore_errors=True)
        # A child killed while writing its result atomically leaves the temporary file (files.py names it so)
        for half_written in result_path.parent.glob(f"{result_path.name}*.tmp"):
            half_written.unlink(missing_ok=True)
    wall = time.monotonic() - run.started

    result = None
    if result_path.exists():
        try:
            result = json.loads(result_path.read_text())
        except json.JSONDecodeError:
            result = None
    phase = phase_path.read_text() if phase_path.exists() else ""
    sampler = run.sampler
    return ChildRun(child.returncode, result, run.timed_out, sampler.peak_bytes, run.killed, phase,
                    _tail(log_path), wall, rss_sum_peak_bytes=sampler.rss_sum_peak_bytes,
                    peak_counts=sampler.peak_counts, smaps_unreadable=sampler.smaps_unreadable, began=run.began,
                    budget_ended=run.timed_out and run.budget_ends_it)


class Forked:
    """A child forked by the zygote (probe/zygote.py), which has torch imported already."""

    def __init__(self, zygote: "Zygote", argv: list[str], log_path: Path, env: dict[str, str],
                 ready_by: float | None = None):
        self.zygote = zygote
        zygote.forked = True
        self.pid = zygote.request({"argv": argv, "log": str(log_path), "env": env}, ready_by)["pid"]
        self.returncode: int | None = None

    def wait_until(self, deadline: float) -> bool:
        # The zygote reports the exit the moment it reaps the child: sleep on its reply pipe, like on a pidfd.
        if not sleep_until_readable(self.zygote.replies, deadline):
            return False
        self.wait()
        return True

    def wait(self) -> None:
        if self.returncode is None:
            try:
                self.returncode = self.zygote.reply()["exitcode"]
            except BaseException:  # e.g. a second Ctrl-C: the zygote's replies are out of step from here on
                _discard(self.zygote)
                raise


class NotReady(Exception):
    """A zygote still importing torch when the probe waiting for it reached its deadline."""


class UnsafePreload(Exception):
    """A zygote whose import of `module` left a thread running or CUDA initialised (zygote._preload): it has
    exited, as no child may be forked from it."""

    def __init__(self, module: str, why: str):
        super().__init__(f"preloading {module}: {why}")
        self.module = module


NEW_PARENT_PHASE = "starting its new parent process (importing torch)"


class Zygote:
    """The long-lived pre-warmed parent of probe children; one per environment, started on first use."""

    def __init__(self, python: str, env: dict[str, str], preload: Sequence[str] = ()):
        """Start the zygote and return at once: its import of torch (and of `preload`, a framework's modules) goes
        on while others start (`start_zygotes`); the first request waits for it."""
        self.python, self.env = python, env
        self.proc = subprocess.Popen([python, "-m", "tune_advisor.probe.zygote", *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, bufsize=0)
        self.replies = self.proc.stdout.fileno()
        self.ready = False
        self.forked = False  # whether any child came from it (a probe asking for a new parent takes one that has not)
        self.preloaded = list(preload)  # the modules asked of it, imported or not: its children have them

    def request(self, message: dict, ready_by: float | None = None) -> dict:
        """Send `message` and return the reply; a zygote still starting, or the reply, is waited for until
        `ready_by` (monotonic; None: as long as it takes), then NotReady."""
        if not self.ready:
            if ready_by is not None and not sleep_until_readable(self.replies, ready_by):
                raise NotReady
            ready = self.reply()
            _check_preload(ready)
            if not ready.get("ready"):
                raise OSError("the zygote did not start")
            self.ready = True
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()
        if ready_by is not None and not sleep_until_readable(self.replies, ready_by):
            raise NotReady
        return self.reply()

    def preload(self, modules: list[str], ready_by: float | None = None) -> None:
        """Have the zygote import those of `modules` it was not asked for yet, before it forks the next child."""
        missing = [name for name in modules if name not in self.preloaded]
        if missing:
            self.preloaded += missing
            _check_preload(self.request({"preload": missing}, ready_by))

    def reply(self) -> dict:
        line = self.proc.stdout.readline()  # unbuffered: never reads past the line, so select() stays exact
        if not line:
            raise OSError("the zygote exited")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()  # the zygote exits when its request pipe closes
        self.proc.wait()
        self.proc.stdout.close()


def _check_preload(reply: dict) -> None:
    """UnsafePreload where the zygote's reply says a module it imported made forking unsafe (it has exited)."""
    unsafe = (reply.get("preload") or {}).get("unsafe")
    if unsafe:
        raise UnsafePreload(unsafe["module"], unsafe["why"])


ZYGOTE_START_S = 2.5  # a new zygote's import of torch and friends: 2.1 s on 2 cores (AMD EPYC, 2026-11-28)
_zygotes: dict[int, Zygote] = {}  # by slot: a zygote runs one child at a time; lockstep pairs use slots 0 and 1
_unsafe_preloads: set[str] = set()  # modules whose import made a zygote unsafe to fork from: children import them


def start_child(python: str, argv: list[str], log_path: Path, env: dict[str, str], slot: int = 0,
                ready_by: float | None = None, preload: Sequence[str] = ()) -> Spawned | Forked | NotStarted:
    """Fork the child from the slot's zygote (started, or restarted when the environment changed, as needed), which
    imports `preload` first (ProbeSpec.preload); a new process when TUNE_ADVISOR_NO_ZYGOTE is set or the zygote
    cannot start; NotStarted (the zygote ended) when it is not ready by `ready_by`."""
    if not _zygotes_used():
        return Spawned(python, argv, log_path, env)
    shared = _zygote_env(env)
    for _ in range(2):  # a zygote that died (killed from outside) or was made unsafe by a preload is replaced once
        zygote, wanted = _zygotes.get(slot), _preloadable(preload)
        try:
            # one that preloaded modules this child does not import would change its memory (a plain workload's)
            if (zygote is None or zygote.env != shared or zygote.python != python or zygote.proc.poll() is not None
                    or not set(zygote.preloaded) <= set(wanted)):
                if zygote is not None:
                    del _zygotes[slot]
                    zygote.close()
                zygote = _zygotes[slot] = Zygote(python, shared, wanted)
            zygote.preload(wanted, ready_by)
            return Forked(zygote, argv, log_path, env, ready_by)
        except NotReady:
            _discard(zygote)
            return NotStarted()
        except UnsafePreload as exc:  # it has exited; the next one leaves those modules to the children
            _unsafe_preloads.add(exc.module)
            _discard(zygote)
        except (OSError, ValueError):
            _zygotes.pop(slot, None)
    return Spawned(python, argv, log_path, env)


def _preloadable(modules: Sequence[str]) -> list[str]:
    """`modules` but those whose import made a zygote unsafe to fork from (`_unsafe_preloads`)."""
    return [name for name in modules if name not in _unsafe_preloads]


def _zygotes_used() -> bool:
    return not os.environ.get("TUNE_ADVISOR_NO_ZYGOTE") and hasattr(os, "fork")


def _zygote_env(env: dict[str, str]) -> dict[str, str]:
    """What a zygote is keyed on: a child's environment but the temporary folder, which each child has its own of
    (no reason for a new zygote)."""
    shared = {k: v for k, v in env.items() if k != "TMPDIR"}
    shared.update({"TMPDIR": os.environ["TMPDIR"]} if "TMPDIR" in os.environ else {})
    return shared


def start_zygotes(slots: dict[int, Sequence[str]], python: str = sys.executable) -> None:
    """Start a new zygote in each slot (`slots`: the modules its probe preloads, ProbeSpec.preload), all at once, for
    probes that ask for a new parent (`ProbeSpec.fresh_parent`): a lockstep pair's two then import torch (and a
    framework) side by side, not one after the other (one start's wait, not two)."""
    if not _zygotes_used():
        return
    shared = _zygote_env(_child_env())
    for slot, preload in slots.items():
        retire_zygote(slot)
        try:
            _zygotes[slot] = Zygote(python, shared, _preloadable(preload))
        except (OSError, ValueError):  # start_child tries again, and falls back to a new process
            pass


def _unused(slot: int) -> bool:
    """Whether the slot holds a zygote that has forked no child yet (`start_zygotes`): a new parent already."""
    zygote = _zygotes.get(slot)
    return zygote is not None and not zygote.forked and zygote.proc.poll() is None


def retire_zygote(slot: int) -> None:
    """End the slot's zygote, if any: the next probe in that slot forks from a new one (`ProbeSpec.fresh_parent`)."""
    zygote = _zygotes.pop(slot, None)
    if zygote is not None:
        zygote.close()


def _discard(zygote: Zygote) -> None:
    """Stop using `zygote` (the next probe starts a new one) and end it; its child was killed already."""
    for slot, held in list(_zygotes.items()):
        if held is zygote:
            del _zygotes[slot]
    zygote.proc.kill()
    zygote.close()


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


def run_probe(spec: ProbeSpec, workdir: Path, role: str = "", launcher: Launcher | None = None) -> ProbeResult:
    """Run one probe child (a distributed one through `launcher`) and turn however it ended into a ProbeResult."""
    return finish_probe(start_probe(spec, workdir, role, launcher=launcher))


def finish_probe(started: Started) -> ProbeResult:
    """Wait for a started probe (`start_probe`) and turn however it ended into a ProbeResult."""
    spec, workdir, role = started.spec, started.workdir, started.role
    run = wait_child(started)
    res = run.result or {}
    result = ProbeResult(
        id=spec.id, settings=dict(spec.settings), status=Status(res.get("status", Status.CRASHED.value)),
        error=res.get("error"), raw=res.get("raw") or {}, unit=res.get("unit", "samples/s"),
        applied=res.get("applied") or {}, extra=res.get("extra") or {}, gpu=res.get("gpu"),
        wall_s=run.wall_s, role=role, seed=spec.seed,
    )
    memory = dict(res.get("memory") or {})
    memory["sampled_tree_peak_bytes"] = run.peak_bytes  # pages shared by forked workers once (tree_peak_counts)
    memory["sampled_tree_rss_sum_peak_bytes"] = run.rss_sum_peak_bytes
    memory["tree_peak_counts"] = run.peak_counts
    if run.smaps_unreadable:
        memory["smaps_unreadable"] = run.smaps_unreadable
    result.memory = memory
    result.peak_memory_bytes = peak_memory(memory, spec.device)

    if run.timed_out:
        where = f" (last phase: {run.phase})" if run.phase else ""
        killed = (f"killed the probe's process group ({run.killed} process{'es' if run.killed != 1 else ''})"
                  if run.began else "its new parent was ended before it forked the probe's child")
        if run.budget_ended:  # the analysis ran out of time, not the probe: no verdict on its settings
            result.status = Status.STOPPED
            # an exploring probe's limit is the budget less the time kept for the ablation and confirmation
            # (Budget.time_left): an H200 run read "the budget ran out" at 37 s of its 75
            what = ("the analysis budget (--budget)" if role.startswith("confirm") else
                    "the time the analysis budget (--budget) leaves for exploring, before the confirmation,")
            result.error = f"stopped: {what} ran out {spec.budget_left_s:.1f} s into it{where}; {killed}"
            result.extra["budget_stopped"] = True
        else:
            result.status = Status.TIMEOUT
            limit = f"the {spec.limit_s:g} s limit{' of a lockstep side' if spec.lockstep else ''}"
            result.error = f"no result within {limit}{where}; {killed}"
    elif run.result is None:
        launcher = started.launcher  # a DDP job: which rank failed first, and why
        found = launcher.failure(workdir / f"{spec.id}.result.json", run.log_tail) if launcher else None
        result.status, result.error = (Status(found[0]), found[1]) if found else classify_exit(run, spec)
    if result.ok and not result.measured:  # e.g. a lockstep side stopped before its first step: no figure to read
        result.status = Status.STOPPED
        result.error = "stopped before its first measured step"
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
    """CUDA: the allocator peak. CPU: the larger of the sampled tree's footprint (pages shared by forked workers
    counted once, where smaps_rollup is readable) and the child's own exact maxrss."""
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
