"""The Python API and the work behind `analyze` and `probe`: inspect the workload, run probes, save results."""

from __future__ import annotations

import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import environment, knobs, results, rules
from .collectors import designate, flops
from . import workload as workload_mod
from .errors import UsageError, WorkloadError
from .planner import STRATEGIES, PlanContext, Session, plan
from .probe.result import ProbeResult
from .render import write_reports
from .probe.runner import classify_exit, run_probe, spawn_child
from .probe.spec import ProbeSpec, Protocol

DEFAULT_BUDGET_S = 15 * 60
DEFAULT_PROBE_TIMEOUT_S = 120.0
INSPECT_TIMEOUT_S = 300.0


@dataclass
class Inspection:
    """What the inspect child found in the workload file."""

    path: Path
    facts: knobs.WorkloadFacts
    baseline: dict[str, Any]  # every knob: defaults overlaid with the file's BASELINE
    search: dict[str, list]
    item_name: str
    optional: list[str]


@dataclass
class AnalysisResult:
    baseline: ProbeResult
    recommended: ProbeResult
    speedup: dict[str, Any] | None
    probes: list[ProbeResult]
    notes: list[str]
    unexplored: list[str]
    out_dir: Path
    document: dict[str, Any] = field(repr=False)

    @property
    def results_path(self) -> Path:
        return self.out_dir / "results.json"

    @property
    def changes(self) -> dict[str, Any]:
        """The recommended settings that differ from the baseline."""
        return {k: v for k, v in self.recommended.settings.items() if self.baseline.settings.get(k) != v}


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


def inspect(path: str | Path, device: str, workdir: Path, timeout_s: float = INSPECT_TIMEOUT_S) -> Inspection:
    """Load and check the workload in a child process. Raises WorkloadError (exit 2) for every load problem."""
    shown = str(path)
    resolved = workload_mod.check_file(path)
    spec = ProbeSpec(id="inspect", workload=str(resolved), settings=knobs.full_settings(), device=device,
                     timeout_s=timeout_s, mode="inspect")
    run = spawn_child(spec, workdir)
    if run.timed_out:
        raise WorkloadError(shown, f"loading the workload took longer than {timeout_s:g} s "
                                   f"(stuck while {run.phase or 'starting'})", "make build_model()/build_dataset() fast")
    if run.result is None:
        _, cause = classify_exit(run, spec)
        raise WorkloadError(shown, f"the process loading the workload {cause}",
                            "run build_model() and build_dataset() by hand to find the fault")
    if run.result.get("status") == "load_error":
        error = run.result["error"]
        raise WorkloadError(shown, error["cause"], error["fix"], line=error.get("line"))
    return Inspection(path=resolved, facts=knobs.WorkloadFacts(**run.result["facts"]),
                      baseline=knobs.full_settings(run.result["baseline"]), search=run.result["search"],
                      item_name=run.result["item_name"], optional=run.result["optional"])


def device_facts(device: str) -> knobs.DeviceFacts:
    import torch

    if device.startswith("cuda"):
        return knobs.DeviceFacts("cuda", torch.cuda.get_device_name(torch.device(device)),
                                 torch.cuda.is_bf16_supported())
    # CPU autocast always offers bf16, but it is fast only with native bf16 instructions; the planner measures it
    # either way and uses this only to order the knobs.
    fast_bf16 = bool({"avx512_bf16", "amx_bf16"} & set(environment.cpu_flags()))
    return knobs.DeviceFacts("cpu", environment.cpu_model(), fast_bf16)


def default_out_dir(path: str | Path) -> Path:
    return Path("tune-advisor-report") / Path(path).stem


def prepare_out_dir(out: Path) -> Path:
    try:
        (out / "probes").mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot write to the output folder {out}: {exc.strerror or exc}") from None
    return out


def analyze(path: str | Path, *, out: str | Path | None = None, device: str = "auto",
            budget: str | float | None = DEFAULT_BUDGET_S, probe_timeout: str | float = DEFAULT_PROBE_TIMEOUT_S,
            max_memory: str | int | None = None, protocol: Protocol | None = None, seed: int = 0,
            strategy: str = "adaptive", select: list[str] | None = None, ignore: list[str] | None = None,
            profile: bool = True, command: list[str] | None = None,
            on_probe: Callable[[ProbeResult, Session], None] | None = None,
            on_start: Callable[[Inspection, Session], None] | None = None,
            on_probe_start: Callable[[str, dict, str], None] | None = None) -> AnalysisResult:
    """Plan and run probes for the workload file at `path`; write results.json; return the typed result."""
    started = time.monotonic()  # the budget covers the whole analysis, inspecting the workload included
    if strategy not in STRATEGIES:
        raise UsageError(f"--strategy {strategy}: expected one of {', '.join(STRATEGIES)}")
    rules.chosen(select, ignore)  # a bad --select/--ignore fails now, not after the probes
    budget_s = parse_duration(budget)
    timeout_s = parse_duration(probe_timeout)
    out_dir = prepare_out_dir(Path(out) if out else default_out_dir(path))
    device = environment.resolve_device(device)
    info = inspect(path, device, out_dir / "probes")
    protocol = protocol or Protocol()

    import psutil

    memory_budget = parse_bytes(max_memory)
    if memory_budget is None and device == "cpu":
        memory_budget = int(0.8 * psutil.virtual_memory().available)  # past this the OOM killer takes the machine

    document = results.new_document(command or sys.argv, environment.collect(device), {
        "path": str(path), "model_class": info.facts.model_class, "parameters": info.facts.parameters,
        "facts": vars(info.facts), "item_name": info.item_name, "search": info.search})
    document["budget"].update(limit_s=budget_s, memory_budget_bytes=memory_budget)
    # The roofline for MFU: measured once per machine and cached; children only read the cache. That one-time
    # calibration of the machine is not part of this analysis's budget.
    calibrating = time.monotonic()
    peaks, peaks_status = flops.ensure_peaks(device)
    started += time.monotonic() - calibrating
    document["environment"]["peaks"] = {"status": peaks_status, "flops_per_s": peaks}
    profiled = designate.ProfilePolicy(enabled=profile)  # the baseline and the recommended settings
    results_path = out_dir / "results.json"
    results.write_atomic(results_path, document)

    def runner(probe_id: str, settings: dict[str, Any], role: str) -> ProbeResult:
        if on_probe_start:
            on_probe_start(probe_id, settings, role)
        spec = ProbeSpec(id=probe_id, workload=str(info.path), settings=settings, device=device,
                         protocol=protocol, timeout_s=timeout_s, seed=seed, profile=profiled(role))
        return run_probe(spec, out_dir / "probes", role=role)

    def record(result: ProbeResult) -> None:
        document["probes"].append(result.to_dict())
        document["budget"].update(used_s=round(session.elapsed(), 3), probes_run=len(session.probes),
                                  unexplored=list(session.unexplored))
        results.write_atomic(results_path, document)
        if on_probe:
            on_probe(result, session)

    session = Session(runner, budget_s, on_probe=record, started=started)
    if on_start:
        on_start(info, session)
    ctx = PlanContext(baseline=info.baseline, search=info.search, workload=info.facts,
                      device=device_facts(device), memory_budget_bytes=memory_budget)
    outcome = plan(ctx, session, strategy)

    document["baseline"] = outcome.baseline.to_dict()
    document["recommended"] = outcome.recommended.to_dict()
    document["speedup"] = outcome.speedup
    document["notes"] = outcome.notes
    document["plan"] = outcome.plan_summary()
    document["findings"] = rules.evaluate(document, select, ignore)
    document["budget"].update(used_s=round(session.elapsed(), 3), probes_run=len(session.probes),
                              unexplored=list(outcome.unexplored))
    results.write_atomic(results_path, document)
    write_reports(document, out_dir)
    return AnalysisResult(outcome.baseline, outcome.recommended, outcome.speedup, outcome.probes, outcome.notes,
                          outcome.unexplored, out_dir, document)


def probe(path: str | Path, settings: dict[str, Any] | None = None, *, device: str = "auto",
          probe_timeout: str | float = DEFAULT_PROBE_TIMEOUT_S, protocol: Protocol | None = None,
          seed: int = 0, workdir: str | Path | None = None,
          profile: bool = False) -> tuple[Inspection, ProbeResult]:
    """Measure one configuration: the file's BASELINE overlaid with `settings` (`profile`: run torch.profiler on
    a few extra steps afterwards)."""
    try:
        overrides = knobs.validate_settings(settings or {})
    except ValueError as exc:
        raise UsageError(f"--set: {exc}") from None
    device = environment.resolve_device(device)
    if workdir is None:  # nothing to keep: the probe's files go to a folder removed afterwards
        with tempfile.TemporaryDirectory(prefix="tune-advisor-probe-") as tmp:
            return probe(path, settings, device=device, probe_timeout=probe_timeout, protocol=protocol, seed=seed,
                         workdir=tmp, profile=profile)
    workdir = Path(workdir)
    info = inspect(path, device, workdir)
    full = {**info.baseline, **overrides}
    for name, value in overrides.items():
        reason = knobs.not_applicable(name, value, info.facts, device_facts(device))
        if reason:
            raise UsageError(f"--set {name}={value}: {reason}")
    spec = ProbeSpec(id="probe", workload=str(info.path), settings=full, device=device,
                     protocol=protocol or Protocol(), timeout_s=parse_duration(probe_timeout), seed=seed,
                     profile=profile)
    return info, run_probe(spec, workdir, role="probe")
