"""What compiling adds to a compile probe before this run has measured one: what an earlier run on this machine
measured for the same workload file, else a guess.

torch.compile caches what it builds (environment.inductor_cache_dir), so a model compiled once compiles again in a
fraction of the time: on a 2-core Xeon hf_transformer's first compile took 21 s and later ones 4.2 s,
raw_sensor_mlp's and tiny_batch_mlp's 1.5 s. A compile probe is started only where its compiling fits the budget,
and the guess for a first compile (GUESS_S) kept every 1-minute run from trying compile at all (tiny_batch_mlp,
raw_sensor_mlp: "compile: over budget", then the time went to an ablation). So each run records the compile times
its probes measured in that cache's folder: the record goes where the cache goes (a /tmp cleared at boot takes
both), and the next run on the same file, torch and device reads it.

The record keeps the shortest compile a run measured (its later compiled probes find the cache warm); the allowance
is MARGIN times it. A graph the cache has not seen (another batch size, amp or memory format) compiles longer than
that: the probe may then run to its limit and be stopped, which costs the exploration what was left of it, never
the confirmation (Budget.time_left).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import environment
from ..files import write_json_atomic
from ..probe.result import ProbeResult

# What compiling adds to a probe when nothing was recorded: a small model takes 5-60 s with torch.compile on a 2-core
# CPU the first time (the C++ compiler runs for every kernel); hf_transformer took 21 s.
GUESS_S = 30.0
# A recorded compile, doubled: the machine's load, a graph that changed a little since
MARGIN = 2.0
RECORD = "tune-advisor-compile-times.json"


def record_path() -> Path:
    return Path(environment.inductor_cache_dir()) / RECORD


def key(workload_sha256: str, device_type: str, mode: str) -> str:
    """A record's key: the workload file's contents, torch's version (a new torch compiles anew), device and mode."""
    import torch

    return f"{workload_sha256}:{torch.__version__}:{device_type}:{mode}"


def allowance(workload_sha256: str | None, device_type: str, mode: str) -> tuple[float, str]:
    """(seconds a compile probe of `mode` is reckoned to spend compiling, where that figure comes from)."""
    seconds = _read().get(key(workload_sha256, device_type, mode)) if workload_sha256 else None
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        return GUESS_S, f"{GUESS_S:.0f} s, a guess: no compile of this workload recorded on this machine"
    return MARGIN * seconds, f"{MARGIN * seconds:.1f} s, twice the {seconds:.1f} s an earlier compile took here"


def compile_s(result: ProbeResult) -> float | None:
    """The seconds `result`'s warm-up spent compiling (evidence.CompileStats), where it compiled and measured."""
    if not result.ok:
        return None
    seconds = (result.extra.get("compile") or {}).get("compile_s")
    return float(seconds) if isinstance(seconds, (int, float)) else None


class Recorder:
    """This run's compile times, per mode: the first measured replaces an earlier run's, a shorter one later in
    the run replaces that (the cache was warm by then)."""

    def __init__(self, workload_sha256: str, device_type: str):
        self.workload_sha256, self.device_type = workload_sha256, device_type
        self.shortest: dict[str, float] = {}

    def saw(self, result: ProbeResult) -> None:
        mode, seconds = result.settings.get("compile", "off"), compile_s(result)
        if mode == "off" or seconds is None or seconds >= self.shortest.get(mode, float("inf")):
            return
        self.shortest[mode] = seconds
        record = _read()
        record[key(self.workload_sha256, self.device_type, mode)] = round(seconds, 3)
        try:
            os.makedirs(record_path().parent, exist_ok=True)
            write_json_atomic(record_path(), record)
        except OSError:  # a read-only cache folder: the next run guesses again
            pass


def _read() -> dict:
    try:
        record = json.loads(record_path().read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
