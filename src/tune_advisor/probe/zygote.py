"""A pre-warmed parent for probe children: imports torch once, then forks one fresh child per probe.

Why: a new Python process spends ~3.5 s importing torch (and torch._dynamo, which the first optimizer pulls in)
before a probe can start — more than most probes measure. Forking from a process that has imported them but run
nothing gives each probe the same clean state in a fraction of that.

Why not multiprocessing's forkserver: it re-imports the parent's `__main__` in every child, which would re-run a
user's script that calls `tune_advisor.analyze()` without an `if __name__ == "__main__"` guard.

Protocol, JSON lines over the zygote's stdin/stdout, one probe at a time:
    parent -> zygote  {"argv": [spec_path, result_path], "log": log_path, "env": {...}}
    zygote -> parent  {"pid": N}               as soon as the child is forked
    zygote -> parent  {"pid": N, "exitcode": C} when it has exited (negative C: killed by signal -C)
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
import tempfile

from .process import CHILD_MODULE

PRELOAD = ("torch", "torch._dynamo", "torch.optim", "torch.utils.data", "numpy", CHILD_MODULE,
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
        pid = os.fork()
        if pid == 0:
            _child(request)  # never returns
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        status = _wait(pid, requests)
        replies.write(json.dumps({"pid": pid, "exitcode": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()


def _wait(pid: int, requests: int) -> int:
    """Wait for the child; if the parent dies meanwhile (its request pipe closes), kill the child's process group
    and exit: a probe nobody will time out must not run on."""
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
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                os._exit(0)


def _child(request: dict) -> None:
    code = 1
    try:
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


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills the probe
    for module in PRELOAD:
        __import__(module)
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing else may write into the reply channel
    print(json.dumps({"ready": True}), file=replies, flush=True)
    serve(sys.stdin.fileno(), replies)


if __name__ == "__main__":
    main()
