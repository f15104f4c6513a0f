"""A pre-warmed parent for probe children: imports torch once, then forks one fresh child per probe.

Why: a new Python process spends ~3.5 s importing torch (and torch._dynamo, which the first optimizer pulls in)
before a probe can start — more than most probes measure. Forking from a process that has imported them but run
nothing gives each probe the same clean state in a fraction of that.

Why not multiprocessing's forkserver: it re-imports the parent's `__main__` in every child, which would re-run a
user's script that calls `tune_advisor.analyze()` without an `if __name__ == "__main__"` guard.

Protocol, JSON lines over the zygote's stdin/stdout, one probe at a time:
    zygote -> parent  {"ready": true, "preload": REPORT}  once PRELOAD and the command line's modules are imported
    parent -> zygote  {"argv": [spec_path, result_path], "log": log_path, "env": {...}}
    zygote -> parent  {"pid": N}               as soon as the child is forked
    zygote -> parent  {"pid": N, "exitcode": C} when it has exited (negative C: killed by signal -C)
    parent -> zygote  {"preload": [module, ...]}  between children: import a framework's modules (ProbeSpec.preload)
    zygote -> parent  {"preload": REPORT}
REPORT (`_preload`): {"imported": [...], "failed": {module: error}, "seconds": S}, and "unsafe": {"module", "why"}
where an import left a thread running or CUDA initialised: no child may be forked after that, so the zygote exits (its
ready line then says "ready": false). A failed import is not fatal: the child imports the module itself, as it would
without this.
Nothing here is torch work: the child runs the child entry's `main` (process.CHILD_MODULE, named rather than
imported: it sits above probe/) as the `python -m` child would.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import select
import signal
import sys
import shutil
import tempfile
import threading
import time
from pathlib import Path

from .process import CHILD_MODULE, die_with_parent

# torch._inductor.codecache: 0.08 s here once, not in every child (probe/apply.py share_compile_headers imports it)
PRELOAD = ("torch", "torch._dynamo", "torch._inductor.codecache", "torch.optim", "torch.utils.data", "numpy",
           CHILD_MODULE,
           "tune_advisor.probe.failure", "tune_advisor.probe.inspection", "tune_advisor.probe.training",
           "tune_advisor.script.driver")


def serve(requests: int, replies) -> None:
    """Fork a child per request line read from the fd `requests`; report its pid, then its exit code."""
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = os.read(requests, 65536)
            if not chunk:
                return  # the parent is gone
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        request = json.loads(line)
        if "preload" in request:
            report = _preload(request["preload"])
            replies.write(json.dumps({"preload": report}) + "\n")
            replies.flush()
            if "unsafe" in report:
                os._exit(0)  # a fork now could copy a lock another thread holds; a thread would keep exit waiting
            continue
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:
            _child(request, zygote)  # never returns
        _running.update(request, pid=pid)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        status = _wait(pid, requests)
        _running.clear()
        replies.write(json.dumps({"pid": pid, "exitcode": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()


_running: dict = {}  # the request of the child running now, and its "pid"


def _wait(pid: int, requests: int) -> int:
    """Wait for the child; if the parent dies meanwhile (its request pipe closes), end the child and exit: a probe
    nobody will time out must not run on."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: the parent's own kill is the only guard
        return os.waitpid(pid, 0)[1]
    with os.fdopen(pidfd, "rb", buffering=0):
        while True:
            ready, _, _ = select.select([pidfd, requests], [], [])
            if pidfd in ready:
                return os.waitpid(pid, 0)[1]
            if not os.read(requests, 1):  # the parent sends nothing while a probe runs: this is its exit
                _end_running(0)


def _end_running(code: int) -> None:
    """Kill the running child's process group (its loader workers, paused or not), remove what a killed child
    leaves (a half-written result, its temporary folder), and exit with `code`."""
    if _running:
        try:
            os.killpg(_running["pid"], signal.SIGKILL)  # stopped (SIGSTOP) members die of SIGKILL too
            os.waitpid(_running["pid"], 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        result = Path(_running["argv"][1])
        for half_written in result.parent.glob(f"{result.name}*.tmp"):  # files.py names the temporary file so
            half_written.unlink(missing_ok=True)
        scratch = _running["env"].get("TMPDIR")  # the child's own (runner.start_probe)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    os._exit(code)


def _on_termination(signum, frame) -> None:
    """SIGTERM or SIGHUP, also when sent to the whole run's process group (`timeout`, CI runners): the probe
    child leads a session of its own and gets none, so end it here before going."""
    _end_running(128 + signum)


def _child(request: dict, zygote: int) -> None:
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the zygote's handlers are its own
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        die_with_parent(zygote)  # even a SIGKILLed zygote takes its child along (this fork is from its main thread)
        os.setsid()  # its own process group: the parent kills it and its loader workers as one
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # tempfile cached the zygote's folder; the child has a TMPDIR of its own
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered: a crash keeps what was printed
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        faulthandler.enable(file=sys.stderr, all_threads=True)  # a segfault prints the user's line
        code = importlib.import_module(CHILD_MODULE).main(request["argv"])
    except SystemExit as exc:  # the workload called sys.exit(): exit as a process would
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main(preload: list[str]) -> None:
    """Import PRELOAD, then `preload` (a framework's modules: ProbeSpec.preload), say so, and serve requests."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills the probe
    importing = threading.Event()
    importing.set()
    threading.Thread(target=_leave_if_orphaned, args=(sys.stdin.fileno(), importing), daemon=True).start()
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing else (a module printing as it imports) may write there
    for module in PRELOAD:
        __import__(module)
    report = _preload(preload)
    if "unsafe" in report:
        print(json.dumps({"ready": False, "preload": report}), file=replies, flush=True)
        os._exit(0)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _on_termination)
    importing.clear()  # from here on, the request pipe is serve()'s to read
    print(json.dumps({"ready": True, "preload": report}), file=replies, flush=True)
    serve(sys.stdin.fileno(), replies)


def _preload(modules: list[str]) -> dict:
    """Import `modules` here, once, so that every child forked afterwards has them (a framework takes seconds).
    Never fatal: a failed import is reported, and the child imports the module itself. "unsafe" ({"module", "why"};
    the rest are not imported) where an import left a thread running (forking copies its locks, held or not,
    without the thread to release them) or CUDA initialised (a forked child cannot use it)."""
    began = time.perf_counter()
    report: dict = {"imported": [], "failed": {}}
    for name in modules:
        before = _threads()
        try:
            importlib.import_module(name)
            report["imported"].append(name)
        except (Exception, SystemExit) as exc:  # a module's top level may raise anything, exit() included
            report["failed"][name] = f"{type(exc).__name__}: {exc}"
        started = _threads() - before
        why = (f"importing it started {len(started)} thread(s)" if started else
               "importing it initialised CUDA" if sys.modules["torch"].cuda.is_initialized() else None)
        if why:
            report["unsafe"] = {"module": name, "why": why}
            break
    report["seconds"] = round(time.perf_counter() - began, 3)
    return report


def _threads() -> set:
    """The ids of this process's threads: the kernel's list, native threads (OpenMP's, CUDA's) included, where
    /proc has one; else Python's."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return {thread.ident for thread in threading.enumerate()}


def _leave_if_orphaned(requests: int, importing: threading.Event) -> None:
    """While torch imports (seconds): exit as soon as the parent is gone. The parent writes nothing before the
    ready line, so the request pipe turns readable only by closing; after that line it is serve()'s."""
    while importing.is_set():
        ready, _, _ = select.select([requests], [], [], 0.5)
        if ready and importing.is_set():
            os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
