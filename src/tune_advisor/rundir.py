"""The output folder of an analysis: one run at a time in it, and what an interrupted run left there to resume."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

from .errors import UsageError
from .probe.result import ProbeResult

LOCK_NAME = ".tune-advisor.lock"
# What a killed run can leave: the temporary files of results.json and the reports (files.write_bytes_atomic names
# them `<name>…tmp`), the temporary folder of the probe that was running and its half-written result (probe.runner).
TEMP_PATTERNS = ("results.json*.tmp", "report.*.tmp", "probes/*.scratch", "probes/*.result.json*.tmp")


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold the folder for this run: a second run into it is refused, never interleaved.

    An flock, which the kernel releases when the holder dies however it dies: a killed run leaves no stale lock.
    """
    import fcntl

    path = Path(out) / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise UsageError(f"{out} is in use by another tune-advisor run"
                             f"{f' (pid {holder})' if holder.isdigit() else ''}; wait for it to end or choose "
                             "another folder with -o") from None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the last holder removed the file between our open and our lock: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        path.unlink(missing_ok=True)  # before unlocking, so a waiter that opened this file sees it is gone
        os.close(fd)


def remove_temp_files(out: Path) -> None:
    """A run killed in the middle of a write leaves its temporary file (the real one is intact); sweep them up.
    Call while holding the lock: no other run can be writing them."""
    for pattern in TEMP_PATTERNS:
        for tmp in Path(out).glob(pattern):
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.unlink(missing_ok=True)


def identity(workload: Path, space: dict[str, Any]) -> dict[str, Any]:
    """What a resumed run must share with the interrupted one, besides the machine's fingerprint: the workload
    file's contents and the settings space (baseline, SEARCH, strategy, measurement protocol, ...)."""
    return {"workload_sha256": hashlib.sha256(Path(workload).read_bytes()).hexdigest(),
            "space": json.loads(json.dumps(space))}  # as it will read back from results.json


def changes(previous: dict[str, Any], current: dict[str, Any], fingerprint: str) -> list[str]:
    """What differs between the interrupted run's document and this run, in words; empty when it may resume."""
    run = previous.get("run")
    if not isinstance(run, dict):
        return ["it was saved by an older tune-advisor, without the facts resuming checks"]
    found = []
    if run.get("workload_sha256") != current["workload_sha256"]:
        found.append("the workload file changed")
    old_space = run.get("space") if isinstance(run.get("space"), dict) else {}
    found += [f"{key} changed ({_short(old_space.get(key))} then, {_short(value)} now)"
              for key, value in current["space"].items() if old_space.get(key) != value]
    old_fp = previous.get("environment", {}).get("fingerprint")
    if old_fp != fingerprint:
        found.append(f"the hardware changed (fingerprint {old_fp} then, {fingerprint} now)")
    return found


def finished_probes(previous: dict[str, Any], path: Path) -> list[tuple[ProbeResult, float, dict]]:
    """The interrupted run's probes in run order: (result, session elapsed when recorded, the saved dict)."""
    found, elapsed = [], 0.0
    for entry in previous["probes"]:
        try:
            result = ProbeResult.from_dict(entry)
            # Files written before `elapsed_s` existed: the probes' wall times, summed, stand in.
            elapsed = float(entry["elapsed_s"]) if "elapsed_s" in entry else elapsed + result.wall_s
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"{path}: probe {entry.get('id')} cannot be reused ({type(exc).__name__}: {exc}); "
                             "was the file edited? Run without --resume to start afresh") from None
        found.append((result, elapsed, entry))
    return found


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
