"""What `analyze` is asked to do (`AnalyzeOptions`), parsed and checked once, before anything runs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from .. import executors, knobs, rules
from ..errors import UsageError
from ..planner import STRATEGIES
from ..probe.spec import Protocol
from ..script import flags

# A first try's wait (issue 63): on the budget curve's fixtures most plans end on their own by 3 minutes on 2 cores;
# a plan the budget cuts says what more time would have tried and how to run the thorough one
# (planner/budget.THOROUGH_S, docs/planner.md "The default budget").
DEFAULT_BUDGET_S = 3 * 60
DEFAULT_PROBE_TIMEOUT_S = 120.0
DEFAULT_MEMORY_MARGIN = "10%"  # of the memory capacity, kept free at the recommended batch


def parse_duration(text: str | float | int | None) -> float | None:
    """'90s', '5m', '1h', '1m30s' or plain seconds -> seconds."""
    if text is None or isinstance(text, (int, float)):
        return None if text is None else float(text)
    match = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or not match or not any(match.groups()):
        raise UsageError(f"'{text}' is not a duration; use e.g. 90s, 5m, 1h")
    h, m, s = (float(g) if g else 0.0 for g in match.groups())
    return h * 3600 + m * 60 + s


def parse_bytes(text: str | int | None) -> int | None:
    """'8GiB', '512MB', '2G' or plain bytes -> bytes."""
    if text is None or isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise UsageError(f"'{text}' is not a memory size; use e.g. 8GiB or 512MB")
    power = " KMGT".index(match.group(2).upper() or " ")
    return int(float(match.group(1)) * 1024**power)


def parse_margin(text: str | float | int | None) -> float | int:
    """--memory-margin: '10%', or a number below 1 ('0.1', as pyproject's `memory-margin = 0.1` arrives) -> a share
    of the capacity (float); '4GiB' or a whole number of bytes -> bytes (int)."""
    if text is None:
        text = DEFAULT_MEMORY_MARGIN
    if isinstance(text, str) and re.fullmatch(r"\s*0?\.\d+\s*", text):
        text = float(text)
    if isinstance(text, str) and text.strip().endswith("%"):
        try:
            share = float(text.strip()[:-1]) / 100
        except ValueError:
            share = -1.0
    elif isinstance(text, float):
        share = text
    else:
        try:
            return parse_bytes(text)
        except UsageError:
            share = -1.0
    if not 0 <= share < 1:
        raise UsageError(f"--memory-margin {text}: expected a share of the memory from 0% to below 100% (e.g. 10%) "
                         "or a size (e.g. 4GiB)")
    return share


def memory_headroom(max_memory: int | None, margin: float | int, gpu: dict | None) -> tuple[int | None, int]:
    """(the memory capacity a recommended batch is judged against, the bytes `margin` keeps free of it): the
    explicit --max-memory, else the GPU's memory (`environment.gpu`); (None, 0) on a CPU without --max-memory,
    whose default budget (80% of the memory available) already leaves room."""
    capacity = max_memory or (gpu or {}).get("memory_total_bytes")
    if not capacity:
        return None, 0
    return capacity, int(margin * capacity) if isinstance(margin, float) else min(margin, capacity)


@dataclass(frozen=True)
class AnalyzeOptions:
    """Every option of `analyze`, checked when made (UsageError, before any probe runs) and normalised: `budget`
    and `probe_timeout` accept '5m', '90s' or seconds and hold seconds (budget None: no limit); `max_memory`
    accepts '8GiB' or bytes and holds bytes; `memory_margin` accepts '10%' or '4GiB' and holds a share (float) or
    bytes (int), what a recommended batch must leave free of the capacity (--max-memory, else the GPU's memory:
    `margin_bytes`); `out` holds a Path, `protocol` a Protocol (None: the default), and
    sequences tuples.

    `out`: the output folder (default tune-advisor-report/<stem>). `device`: auto, cpu, cuda or cuda:N.
    `only_knobs`: the only knobs the adaptive planner explores. `select`/`ignore`: rule code prefixes. `profile`:
    torch.profiler on the baseline and recommended probes. `command`: recorded in results.json (default
    sys.argv). `nproc_per_node`, `nnodes`, `rdzv_endpoint`: DDP probes through torchrun. `executor`: local or ray
    (`ray_address`: the cluster to join). `resume`: continue the interrupted run in `out`, reusing its finished
    probes. `script_args`: a plain script's arguments (after `--`); `maps`: its flags that set knobs (`--map`
    specs, or pyproject's knob -> FLAG[:VALUE] table), held as {knob: FlagMap}; `script_cwd`: the folder the script
    runs in (None: a scratch folder per probe mirroring the caller's); `as_script`: True/False run the file as a
    plain script/a workload whatever it defines (None: workload.is_script decides). See docs/script-mode.md. `session_drift`: the log sd of the
    machine's level between runs that every figure's interval carries (None: figures.SESSION_DRIFT), and, scaled,
    the speedup's range for a later measure (`figures.speedup_drift`). `train_steps`: how many steps (at the
    baseline's batch size) the user's training runs; compile is then recommended only where its compile time pays
    off within them (analysis/breakeven.py; None: not stated).
    """

    out: Path | str | None = None
    device: str = "auto"
    budget: float | str | None = DEFAULT_BUDGET_S
    probe_timeout: float | str = DEFAULT_PROBE_TIMEOUT_S
    max_memory: int | str | None = None
    memory_margin: float | int | str = DEFAULT_MEMORY_MARGIN
    protocol: Protocol | None = field(default_factory=Protocol)
    seed: int = 0
    strategy: str = "adaptive"
    only_knobs: Sequence[str] | None = None
    select: Sequence[str] | None = None
    ignore: Sequence[str] | None = None
    profile: bool = True
    command: Sequence[str] | None = None
    nproc_per_node: int = 1
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    executor: str = "local"
    ray_address: str | None = None
    resume: bool = False
    script_args: Sequence[str] | None = None
    maps: Sequence[str] | Mapping[str, str] | None = None
    script_cwd: Path | str | None = None
    as_script: bool | None = None
    session_drift: float | None = None
    cost_per_hour: float | None = None  # what an hour of the machine costs: the reports show an epoch's cost
    train_steps: int | None = None  # --train-steps: the user's run, in steps at the baseline's batch (compile's break-even)

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise UsageError(f"--strategy {self.strategy}: expected one of {', '.join(STRATEGIES)}")
        rules.chosen(self.select, self.ignore)  # a bad --select/--ignore fails now, not after the probes
        unknown = [name for name in self.only_knobs or [] if name not in knobs.KNOBS]
        if unknown:
            raise UsageError(f"--knobs {','.join(unknown)}: no such knob; the knobs are {', '.join(knobs.KNOBS)}")
        executors.check(self.executor, self.ray_address)
        if self.session_drift is not None and not 0 <= self.session_drift < 1:
            raise UsageError(f"--session-drift {self.session_drift}: expected how far this machine's level moves "
                             "between runs as a log sd, from 0 (it never moves) to below 1 (e.g. 0.074)")
        if self.cost_per_hour is not None and not self.cost_per_hour > 0:
            raise UsageError(f"--cost-per-hour {self.cost_per_hour}: expected what an hour of this machine costs, "
                             "above 0 (e.g. 2.50)")
        if self.train_steps is not None and (isinstance(self.train_steps, bool) or not isinstance(self.train_steps, int)
                                             or self.train_steps < 1):
            raise UsageError(f"--train-steps {self.train_steps}: expected how many training steps (batches at the "
                             "baseline's batch size) your run takes, a whole number of at least 1 (e.g. 20000)")
        normal = {"budget": parse_duration(self.budget), "probe_timeout": parse_duration(self.probe_timeout),
                  "max_memory": parse_bytes(self.max_memory), "memory_margin": parse_margin(self.memory_margin),
                  "out": None if self.out is None else Path(self.out),
                  "protocol": self.protocol or Protocol(),
                  "maps": self.maps if _parsed(self.maps) else flags.parse_maps(self.maps),
                  "script_args": tuple(self.script_args or ()),
                  "script_cwd": None if self.script_cwd is None else Path(self.script_cwd).resolve()}
        for name in ("only_knobs", "select", "ignore", "command"):
            value = getattr(self, name)
            normal[name] = None if value is None else tuple(value)
        for name, value in normal.items():
            object.__setattr__(self, name, value)  # frozen: normalised once, here


def _parsed(maps) -> bool:
    """Whether `maps` is parsed already ({knob: FlagMap}: dataclasses.replace passes it again)."""
    return isinstance(maps, Mapping) and all(isinstance(v, flags.FlagMap) for v in maps.values()) and bool(maps)
