"""The results.json document as typed classes: what the reader checks, the writer validates, the renderers read, and
docs/results-json.schema.json is generated from (`python -m tune_advisor.record --schema`).

Each class is one part of the document; docs/results-json.md says what the fields mean (units, how intervals are
made). Every part accepts keys it does not name (`extra="allow"`) and keeps them: a schema version promises that
later tools only add keys, never repurpose them, and some parts are open by nature (a probe's `extra` and
`applied`, a finding's evidence, the settings of the knob catalogue). Types are strict, as JSON Schema reads them:
no string is taken for a number, no number for a boolean, no NaN.

Schema versions: 2 added the probe statuses `stopped` and `unsupported` and optional keys (figures, plan.ablation,
speedup.interval); a version 1 file is a version 2 file without them, so these classes read both.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .probe.result import Status

__all__ = ["Document", "Probe", "ValidationError", "parse", "problem", "json_schema"]

SCHEMA_VERSION = 2  # 2: probe statuses "stopped" and "unsupported"
StatusName = Literal[tuple(status.value for status in Status)]  # type: ignore[valid-type]  # one owner: Status


class Part(BaseModel):
    """Every part of the document: strict JSON types, unnamed keys kept."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


# --- figures: a median with its 95% interval ---------------------------------------------------------------------


class Interval(Part):
    """A median and its 95% interval (a ratio, or a rate in `unit`)."""

    median: Optional[float] = None
    ci_low: Optional[float] = None
    ci_high: Optional[float] = None


class Throughput(Interval):
    """Items per second over a probe's measured window: moving-block bootstrap median and 95% CI."""

    unit: Optional[str] = None


class Figure(Throughput):
    """The throughput a report prints for the baseline's or the recommendation's settings (planner/figures.py)."""

    interval: Optional[str] = None  # what the interval is over, in words
    runs: list[str] = []


class EnergyFigure(Part):
    """Joules per item for one side's settings: the median over its runs whose window read the energy counter."""

    median: Optional[float] = None
    runs: list[str] = []


class EnergyFigures(Part):
    """The GPU's energy per item for the baseline and the recommendation, and their ratio (planner/figures.py)."""

    unit: Optional[str] = None  # "J/sample", "J/token": joules per the probe's item
    baseline: Optional[EnergyFigure] = None
    recommended: Optional[EnergyFigure] = None
    ratio: Optional[float] = None  # the recommendation's over the baseline's


class Figures(Part):
    baseline: Optional[Figure] = None
    recommended: Optional[Figure] = None
    energy: Optional[EnergyFigures] = None


class Later(Part):
    """Where a later measure of the speedup is expected to fall: the CI widened by the drift between sessions."""

    ci_low: Optional[float] = None
    ci_high: Optional[float] = None
    drift: Optional[float] = None
    interval: Optional[str] = None


class Speedup(Interval):
    """The confirmation: baseline and recommended measured again in rounds."""

    method: Optional[str] = None
    interval: Optional[str] = None
    later: Optional[Later] = None
    probes: list[str] = []


# --- a probe ------------------------------------------------------------------------------------------------------


class StepTime(Part):
    """Seconds per measured step, warm-up excluded."""

    median: Optional[float] = None
    iqr: Optional[float] = None
    samples: list[float] = []


class Loss(Part):
    first: Optional[float] = None
    last: Optional[float] = None
    finite: Optional[bool] = None


class Energy(Part):
    """The GPU's energy counter over the measured window (collectors/nvml.py window_energy): figures null where
    absent, with `status` saying why."""

    status: str = ""  # "ok", or "absent: why"
    joules: Optional[float] = None
    joules_per_item: Optional[float] = None
    items: Optional[float] = None
    window_s: Optional[float] = None


class GpuRank(Part):
    """One rank's own GPU, in a DDP probe."""

    util_mean: Optional[float] = None  # percent
    energy: Optional[Energy] = None


class Gpu(Part):
    """NVML's samples over the measured steps (collectors/nvml.py)."""

    util_mean: Optional[float] = None  # percent, 0-100
    timeline: Optional[dict[str, list[Optional[float]]]] = None  # equal-length columns: t_s, util, mem_gib, ...
    ranks: Optional[list[Optional[GpuRank]]] = None
    energy: Optional[Energy] = None  # a DDP probe's: every rank's GPU summed


class Lockstep(Part):
    """How a probe measured step by step beside a partner (probe/lockstep.py)."""

    partner: Optional[str] = None


class ProbeExtra(Part):
    """What else the child recorded: warm-up, collectors, compile, distributed, ... (open)."""

    lockstep: Optional[Lockstep] = None


class Probe(Part):
    """One probe: the settings it ran and what it measured (probe/result.py ProbeResult.to_dict)."""

    id: str
    role: str = ""
    settings: dict[str, Any]  # {knob: value}; the knob catalogue (knobs.py), not this schema, types the values
    status: StatusName
    error: Optional[str] = None
    throughput: Throughput = Field(default_factory=Throughput)
    step_time_s: StepTime = Field(default_factory=StepTime)
    data_wait_frac: Optional[float] = None
    peak_memory_bytes: Optional[int] = None
    loss: Optional[Loss] = None
    gpu: Optional[Gpu] = None
    wall_s: Optional[float] = None
    elapsed_s: Optional[float] = None
    raw: dict[str, list[Optional[float]]] = {}  # per measured step: data_wait_s, h2d_s, items, loss, loss_step
    memory: dict[str, Any] = {}
    applied: dict[str, Any] = {}
    extra: ProbeExtra = Field(default_factory=ProbeExtra)
    seed: Optional[int] = None


# --- what the rules found -----------------------------------------------------------------------------------------


class Fix(Part):
    settings: dict[str, Any] = {}
    snippet: str = ""


class Gain(Part):
    measured: Optional[bool] = None  # measured by probes, or estimated
    speedup: Optional[float | Interval] = None
    time_saved_frac: Optional[float] = None
    basis: Optional[str] = None


class Finding(Part):
    """One rule's finding (rules/__init__.py to_dict)."""

    code: str = ""
    name: str = ""
    severity: str = ""
    message: str = ""
    evidence: dict[str, Any] = {}
    fix: Fix = Field(default_factory=Fix)
    gain: Gain = Field(default_factory=Gain)
    probes: list[str] = []
    docs: Optional[str] = None


# --- the machine, the workload, the run ---------------------------------------------------------------------------


class Tool(Part):
    name: str
    version: str


class GpuInfo(Part):
    name: Optional[str] = None
    driver: Optional[str] = None
    memory_total_bytes: Optional[int] = None
    capability: Optional[str] = None
    cuda: Optional[str] = None
    bf16_supported: Optional[bool] = None


class NativeType(Part):
    native: bool
    reason: Optional[str] = None


class Peaks(Part):
    """The peak-FLOP/s calibration's outcome (collectors/flops.py ensure_peaks)."""

    status: str
    flops_per_s: Optional[dict[str, Optional[float]]] = None


class Environment(Part):
    """The machine (environment.py); the fields in the order it writes them (the report lists them so)."""

    device: Optional[str] = None
    device_name: Optional[str] = None
    cpu_model: Optional[str] = None
    cpu_flags: list[str] = []
    native_types: Optional[dict[str, NativeType]] = None
    cpu_count: Optional[int] = None
    usable_cores: Optional[int] = None
    memory_total_bytes: Optional[int] = None
    torch: Optional[str] = None
    torch_threads: Optional[int] = None
    python: Optional[str] = None
    platform: Optional[str] = None
    gpu: Optional[GpuInfo] = None
    fingerprint: Optional[str] = None
    peaks: Optional[Peaks] = None


class Facts(Part):
    """What loading the workload found out (open: frameworks and script mode add their own)."""

    conv_layers: Optional[int] = None
    repeated_blocks: Optional[str] = None
    dataset_len: Optional[int] = None
    batch_kind: Optional[str] = None
    iterable_dataset: Optional[bool] = None


class Framework(Part):
    name: Literal["hf", "lightning"]
    config: dict[str, Any] = {}  # the framework's own settings, as the user wrote them


class Script(Part):
    """Script mode: the script's arguments and the flags that set knobs (--map)."""

    args: list[str] = []
    map: dict[str, Any] = {}
    cwd: Optional[str] = None


class Workload(Part):
    path: Optional[str] = None
    model_class: Optional[str] = None
    parameters: Optional[int] = None
    facts: Facts = Field(default_factory=Facts)
    item_name: Optional[str] = None
    search: dict[str, list[Any]] = {}
    framework: Optional[Framework] = None
    kind: Optional[Literal["functions", "framework", "script"]] = None
    script: Optional[Script] = None
    train_steps: Optional[int] = Field(default=None, ge=1)  # --train-steps: the run, in steps at the baseline's batch


class Phases(Part):
    """Where this run's time went outside the probes, in seconds (api/facade.py); `plan_started_s` is the elapsed
    time when the plan began, the others durations."""

    inspection_s: Optional[float] = None
    calibration_s: Optional[float] = None
    plan_started_s: Optional[float] = None
    plan_s: Optional[float] = None
    rules_s: Optional[float] = None
    reports_s: Optional[float] = None


class Budget(Part):
    limit_s: Optional[float] = None
    used_s: Optional[float] = None
    probes_run: Optional[int] = None
    unexplored: list[str] = []
    memory_budget_bytes: Optional[int] = None
    memory_margin_bytes: Optional[int] = None  # --memory-margin: what the recommended batch leaves free (None: none)
    first_provisional_s: Optional[float] = None  # when the plan first kept settings other than the baseline's
    phases: Optional[Phases] = None


class BestGain(Part):
    """A gain over the baseline as the plan measured it: median and 95% CI [low, high]; null: not measurable."""

    median: Optional[float] = None
    ci: list[Optional[float]] = Field(default_factory=list, max_length=2)


class BestSoFar(Part):
    """The plan's best so far (api/facade.py): provisional while the run goes on, and what an interrupted run
    leaves; never confirmed. A complete run has none: its recommendation is the answer."""

    probe: str
    changes: dict[str, Any] = {}
    gain: BestGain = Field(default_factory=BestGain)
    confirmed: Literal[False] = False
    elapsed_s: Optional[float] = None  # when the plan kept it (absent in files written before it)


class Unconfirmed(Part):
    """A complete run's winner that its confirmation measured but could not tell from the noise (planner/confirm.py
    `unconfirmed`): the baseline stays recommended, and the verdict says what was measured."""

    probe: str
    changes: dict[str, Any] = {}
    speedup: Optional[Speedup] = None
    budget_short: bool = False  # the budget ended rounds that still read a gain worth keeping: more time would tell


class Distributed(Part):
    nproc_per_node: Optional[int] = None
    nnodes: Optional[int] = None
    rdzv_endpoint: Optional[str] = None


class Execution(Part):
    executor: Optional[Literal["local", "ray"]] = None
    distributed: Optional[Distributed] = None


class Resume(Part):
    reused: list[str] = []
    discarded: list[str] = []


class Run(Part):
    """What `--resume` checks, and what each resume reused (rundir.py)."""

    state: Literal["running", "interrupted", "complete"]
    workload_sha256: Optional[str] = None
    space: dict[str, Any] = {}
    resumed: list[Resume] = []


class Frontier(Part):
    """The batch-size memory frontier a ladder found."""

    largest_ok: Optional[int] = None
    smallest_failed: Optional[int] = None
    cause: Optional[str] = None
    still_gaining: Optional[bool] = None
    last_step_gain: Optional[float] = None
    settings: dict[str, Any] = {}


class Ablation(Part):
    """One changed knob of the winner measured beside the winner without it (planner/ablation.py)."""

    knob: str
    value: Any = None
    without: Any = None
    probes: list[str] = []
    contribution: Optional[Interval] = None
    kept: Optional[bool] = None
    method: Optional[str] = None
    why: Optional[str] = None
    beside: Optional[str] = None


class Plan(Part):
    strategy: Optional[str] = None
    decisions: list[str] = []
    frontier: Optional[Frontier] = None
    ablation: list[Ablation] = []


class Document(Part):
    """One results.json. Parts a run has not reached yet (a run still going, an older file) are absent: they read as
    their defaults here."""

    schema_version: int = Field(ge=1, le=SCHEMA_VERSION)
    tool: Optional[Tool] = None
    created: Optional[str] = None
    command: list[str] = []
    environment: Environment = Field(default_factory=Environment)
    workload: Workload = Field(default_factory=Workload)
    baseline: Optional[Probe] = None
    recommended: Optional[Probe] = None
    speedup: Optional[Speedup] = None
    probes: list[Probe] = []
    findings: list[Finding] = []
    budget: Budget = Field(default_factory=Budget)
    execution: Optional[Execution] = None
    run: Optional[Run] = None
    figures: Optional[Figures] = None
    notes: list[str] = []
    plan: Plan = Field(default_factory=Plan)
    best_so_far: Optional[BestSoFar] = None
    unconfirmed: Optional[Unconfirmed] = None


def parse(document: dict[str, Any]) -> Document:
    """The typed record of a results.json document (a dict as json.load gives it); raises ValidationError."""
    return Document.model_validate(document)


def problem(error: ValidationError) -> str:
    """The first thing wrong in a document, in one line: where it is and what is wrong there."""
    first = error.errors()[0]
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]).lstrip(".")
    return f"{where or 'the document'}: {first['msg'][:1].lower()}{first['msg'][1:]}"


def json_schema() -> dict[str, Any]:
    """The JSON Schema of results.json (docs/results-json.schema.json)."""
    schema = Document.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "tune-advisor results.json",
            **{k: v for k, v in schema.items() if k != "title"}}


def schema_text() -> str:
    """docs/results-json.schema.json's text, as committed."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--schema"]:
        sys.exit("usage: python -m tune_advisor.record --schema > docs/results-json.schema.json")
    sys.stdout.write(schema_text())
