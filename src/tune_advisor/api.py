"""The Python API and the work behind `analyze` and `probe`: inspect the workload, run probes, save results."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from . import environment, executors, hardware, knobs, results, rules, rundir
from .distributed import launch
from .collectors import designate, flops
from . import workload as workload_mod
from .errors import UsageError, WorkloadError
from .planner import STRATEGIES, PlanContext, Session, plan
from .planner.session import DUEL_ROLE, protocol_for
from .probe.result import ProbeResult
from .render import write_reports
from .probe import lockstep
from .probe.runner import classify_exit, run_probe, spawn_child
from .probe.spec import ProbeSpec, Protocol

DEFAULT_BUDGET_S = 15 * 60
DEFAULT_PROBE_TIMEOUT_S = 120.0
MIN_PROBE_S = 1.0  # a probe started at the budget's end (the confirmation) still gets this long
INSPECT_TIMEOUT_S = 300.0
FINISH_RESERVE_S = 3.0  # what the rules and the reports (charts included) take after the last probe
CALIBRATION_SHARE = 0.1  # of the budget, at most, for measuring the machine's peaks (a first run per machine)


def calibration_limit(budget_s: float | None) -> float:
    """How long measuring the machine's peak FLOP/s may take: flops' own bound, or a tenth of a short budget."""
    return flops.PEAK_TIMEOUT_S if budget_s is None else max(0.5, min(flops.PEAK_TIMEOUT_S,
                                                                      CALIBRATION_SHARE * budget_s))


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
                                   f"(stuck while {run.phase or 'starting'})",
                            "make build_model()/build_dataset() fast")
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
    """What decides which knobs apply on `device`; bf16 counts only where the hardware computes it natively
    (emulated, autocast still runs but many times slower: probing it would only spend the budget)."""
    import torch

    bf16 = hardware.native_types(device).bf16
    if device.startswith("cuda"):
        dev = torch.device(device)
        return knobs.DeviceFacts("cuda", torch.cuda.get_device_name(dev), bf16.native, bf16.reason,
                                 tf32=torch.cuda.get_device_capability(dev) >= (8, 0),
                                 compile_unavailable=environment.compile_unavailable("cuda"))
    return knobs.DeviceFacts("cpu", environment.cpu_model(), bf16.native, bf16.reason,
                             compile_unavailable=environment.compile_unavailable("cpu"))


def pair_memory(device: str, memory_budget: int | None) -> int | None:
    """The memory two probes measured together in lockstep may use between them: the memory budget on a CPU;
    on a GPU they share its memory, so (of --max-memory, if smaller) most of it."""
    if not device.startswith("cuda"):
        return memory_budget
    import torch

    room = int(0.9 * torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return min(room, memory_budget) if memory_budget else room


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


@contextlib.contextmanager
def _file_errors():
    """A full disk or a folder gone read-only while the run writes its files: a clear message, not a traceback."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:  # not a file's problem (a pipe, a process): a bug to see whole
            raise
        raise UsageError(f"{exc.filename}: {exc.strerror or exc}") from None


def _previous_run(results_path: Path, notice: Callable[[str], None]) -> dict[str, Any] | None:
    """The results.json an interrupted run left, for --resume (UsageError when it is unreadable)."""
    if not results_path.exists():
        notice(f"--resume: {results_path} does not exist, so there is nothing to resume: starting afresh")
        return None
    previous = results.read(results_path)
    state = previous.get("run", {}).get("state", "unknown")
    verb = "had finished" if state == "complete" else "was interrupted" if state == "interrupted" else "was stopped"
    n = len(previous["probes"])
    notice(f"--resume: the run in {results_path.parent} {verb}; its {n} finished probe{'s' if n != 1 else ''} "
           f"{'are' if n != 1 else 'is'} reused, not run again")
    return previous


def analyze(path: str | Path, *, out: str | Path | None = None, device: str = "auto",
            budget: str | float | None = DEFAULT_BUDGET_S, probe_timeout: str | float = DEFAULT_PROBE_TIMEOUT_S,
            max_memory: str | int | None = None, protocol: Protocol | None = None, seed: int = 0,
            strategy: str = "adaptive", only_knobs: list[str] | None = None, select: list[str] | None = None,
            ignore: list[str] | None = None, profile: bool = True, command: list[str] | None = None,
            nproc_per_node: int = 1, nnodes: int = 1, rdzv_endpoint: str | None = None,
            executor: str = "local", ray_address: str | None = None,
            on_probe: Callable[[ProbeResult, Session], None] | None = None,
            on_start: Callable[[Inspection, Session], None] | None = None,
            on_probe_start: Callable[[str, dict, str], None] | None = None,
            resume: bool = False, on_notice: Callable[[str], None] | None = None) -> AnalysisResult:
    """Plan and run probes for the workload file at `path`; write results.json; return the typed result.

    One run at a time per output folder (a lock; a second gets UsageError). Ctrl-C (KeyboardInterrupt) stops the
    running probe, saves what finished as results.json and reports, and re-raises. `resume`: continue the run
    that `out` holds, reusing its finished probes; refused (UsageError) when the workload file, the settings space
    or the hardware changed since. `on_notice` receives messages about resuming.
    """
    started = time.monotonic()  # the budget covers the whole analysis, inspecting the workload included
    if strategy not in STRATEGIES:
        raise UsageError(f"--strategy {strategy}: expected one of {', '.join(STRATEGIES)}")
    rules.chosen(select, ignore)  # a bad --select/--ignore fails now, not after the probes
    unknown = [name for name in only_knobs or [] if name not in knobs.KNOBS]
    if unknown:
        raise UsageError(f"--knobs {','.join(unknown)}: no such knob; the knobs are {', '.join(knobs.KNOBS)}")
    budget_s = parse_duration(budget)
    timeout_s = parse_duration(probe_timeout)
    out_dir = prepare_out_dir(Path(out) if out else default_out_dir(path))
    notice = on_notice or (lambda message: None)
    results_path = out_dir / "results.json"
    with rundir.locked(out_dir), _file_errors():
        rundir.remove_temp_files(out_dir)
        previous = _previous_run(results_path, notice) if resume else None
        finished = rundir.finished_probes(previous, results_path) if previous else []
        device = environment.resolve_device(device)
        layout = launch.check(nproc_per_node, nnodes, rdzv_endpoint, device)  # DDP probes through torchrun, or None
        pool = executors.create(executor, ray_address, device)  # None: probes run here, one at a time
        info = inspect(path, device, out_dir / "probes",
                       INSPECT_TIMEOUT_S if budget_s is None else min(INSPECT_TIMEOUT_S, budget_s))
        protocol = protocol or Protocol()

        import psutil

        memory_budget = parse_bytes(max_memory)
        run_id = rundir.identity(info.path, {
            "device": device, "baseline": info.baseline, "search": info.search, "strategy": strategy,
            "protocol": dataclasses.asdict(protocol), "seed": seed, "max_memory_bytes": memory_budget,
            "knobs": sorted(only_knobs) if only_knobs else None,
            "distributed": layout})
        if memory_budget is None and previous:  # the default depends on free memory: keep the one planned with
            memory_budget = previous.get("budget", {}).get("memory_budget_bytes")
        if memory_budget is None and device == "cpu":
            memory_budget = int(0.8 * psutil.virtual_memory().available)  # past this the OOM killer takes the machine

        document = results.new_document(command or sys.argv, environment.collect(device), {
            "path": str(path), "model_class": info.facts.model_class, "parameters": info.facts.parameters,
            "facts": vars(info.facts), "item_name": info.item_name, "search": info.search})
        document["budget"].update(limit_s=budget_s, memory_budget_bytes=memory_budget)
        document["execution"] = {"executor": executor, "distributed": layout}
        document["run"] = {"state": "running", **run_id, "resumed": []}
        if previous is not None:
            changed = rundir.changes(previous, run_id, document["environment"]["fingerprint"])
            if changed:
                raise UsageError(f"--resume: cannot continue the run in {out_dir}: {'; '.join(changed)}, so its "
                                 "probes do not measure this one. Run without --resume to start afresh (replacing "
                                 "its results), or choose another folder with -o")
            earlier = previous.get("run", {}).get("resumed")
            document["run"]["resumed"] = list(earlier) if isinstance(earlier, list) else []
        saved = {id(result): entry for result, _, entry in finished}  # replayed probes are saved as they were
        # The roofline for MFU: measured once per machine and cached; children only read the cache. It counts
        # against the budget like everything else the user waits for, so it gets a small share of it.
        peaks, peaks_status = flops.ensure_peaks(device, timeout_s=calibration_limit(budget_s))
        document["environment"]["peaks"] = {"status": peaks_status, "flops_per_s": peaks}
        profiled = designate.ProfilePolicy(enabled=profile)  # the baseline and the recommended settings
        if not finished:  # when resuming, the file on disk keeps every finished probe until the replay is over
            results.write_atomic(results_path, document)

        def make_spec(probe_id: str, settings: dict[str, Any], role: str) -> ProbeSpec:
            if on_probe_start:
                on_probe_start(probe_id, settings, role)
            left = session.time_left(role)
            left = None if left is None else max(left, MIN_PROBE_S)
            return ProbeSpec(id=probe_id, workload=str(info.path), settings=settings, device=device,
                             protocol=protocol_for(role, protocol, left), timeout_s=timeout_s, seed=seed,
                             profile=profiled(role), count_flops=role != DUEL_ROLE,
                             distributed=layout, budget_left_s=left)

        def runner(probe_id: str, settings: dict[str, Any], role: str) -> ProbeResult:
            spec = make_spec(probe_id, settings, role)
            return pool.run(spec, out_dir / "probes", role) if pool else run_probe(spec, out_dir / "probes", role=role)

        if pool is None and layout is None:  # duels and the confirmation: two probes in lockstep (probe/lockstep.py)
            def pair(jobs: list[tuple[str, dict[str, Any], str]], first: int) -> list[ProbeResult]:
                specs = [make_spec(*job) for job in jobs]
                # one protocol and one limit for both: the budget left was read twice, microseconds apart
                specs[1] = replace(specs[1], protocol=specs[0].protocol, budget_left_s=specs[0].budget_left_s)
                roles = [job[2] for job in jobs]
                return lockstep.run_pair(specs, out_dir / "probes", roles, first=first, noise="ratio",
                                         first_takes_slot0=True)

            runner.pair = pair
            runner.pair_memory_bytes = pair_memory(device, memory_budget)

        if pool:  # independent probes (the grid) go out together; Session.run_many records each as it finishes
            runner.many = lambda jobs: pool.many([(make_spec(*job), job[2]) for job in jobs], out_dir / "probes")
            runner.width = pool.width

        def record(result: ProbeResult) -> None:
            entry = saved.get(id(result)) or {**result.to_dict(), "elapsed_s": round(session.elapsed(), 3)}
            document["probes"].append(entry)
            document["budget"].update(used_s=round(session.elapsed(), 3), probes_run=len(session.probes),
                                      unexplored=list(session.unexplored))
            if not session.replaying:
                results.write_atomic(results_path, document)
            if on_probe:
                on_probe(result, session)

        def note_resume() -> None:
            if previous is not None:
                document["run"]["resumed"].append({"reused": [p.id for p in session.reused],
                                                   "discarded": [p.id for p in session.discarded]})

        # The budget ends when the last file is written: the planner stops where rules and reports still fit.
        planning_s = None if budget_s is None else max(0.0, budget_s - FINISH_RESERVE_S)
        session = Session(runner, planning_s, on_probe=record, started=started,
                          finished=[(result, elapsed) for result, elapsed, _ in finished])
        if on_start:
            on_start(info, session)
        ctx = PlanContext(baseline=info.baseline, search=info.search, workload=info.facts,
                          device=replace(device_facts(device), world_size=launch.world_size(layout)),
                          memory_budget_bytes=memory_budget, explore=tuple(only_knobs) if only_knobs else None)
        try:
            outcome = plan(ctx, session, strategy)
        except KeyboardInterrupt:  # the running probe's group is killed already (probe.runner); keep what finished
            if not session.replaying:  # mid-replay the file on disk still holds every finished probe
                document["run"]["state"] = "interrupted"
                note_resume()
                document["notes"] = [f"interrupted after {len(session.probes)} probes, before a recommendation; "
                                     "`tune-advisor analyze --resume` continues the run"]
                results.write_atomic(results_path, document)
                write_reports(document, out_dir)  # a second Ctrl-C may cut this short: results.json is saved
            raise
        finally:
            if pool:
                pool.close()
        session.end_replay()
        if session.discarded:
            outcome.notes.append(f"resumed: the plan left the interrupted run's path at {session.discarded[0].id} "
                                 f"(e.g. a different budget), so {len(session.discarded)} of its probes were not "
                                 "reused")
        note_resume()
        document["run"]["state"] = "complete"

        document["baseline"] = outcome.baseline.to_dict()
        document["recommended"] = outcome.recommended.to_dict()
        document["speedup"] = outcome.speedup
        unit = outcome.baseline.unit
        document["figures"] = {  # each setting's best-founded throughput, from all of its runs (Session.figure)
            "baseline": session.figure(outcome.baseline.settings, unit),
            "recommended": session.figure(outcome.recommended.settings, unit)}
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
          seed: int = 0, workdir: str | Path | None = None, profile: bool = False,
          nproc_per_node: int = 1, nnodes: int = 1,
          rdzv_endpoint: str | None = None) -> tuple[Inspection, ProbeResult]:
    """Measure one configuration: the file's BASELINE overlaid with `settings` (`profile`: run torch.profiler on
    a few extra steps afterwards)."""
    try:
        overrides = knobs.validate_settings(settings or {})
    except ValueError as exc:
        raise UsageError(f"--set: {exc}") from None
    device = environment.resolve_device(device)
    layout = launch.check(nproc_per_node, nnodes, rdzv_endpoint, device)
    if workdir is None:  # nothing to keep: the probe's files go to a folder removed afterwards
        with tempfile.TemporaryDirectory(prefix="tune-advisor-probe-") as tmp:
            return probe(path, settings, device=device, probe_timeout=probe_timeout, protocol=protocol, seed=seed,
                         workdir=tmp, profile=profile, nproc_per_node=nproc_per_node, nnodes=nnodes,
                         rdzv_endpoint=rdzv_endpoint)
    workdir = Path(workdir)
    info = inspect(path, device, workdir)
    full = {**info.baseline, **overrides}
    for name, value in overrides.items():
        facts = replace(device_facts(device), world_size=launch.world_size(layout))
        reason = knobs.not_applicable(name, value, info.facts, facts, full)
        if reason:
            raise UsageError(f"--set {name}={value}: {reason}")
    spec = ProbeSpec(id="probe", workload=str(info.path), settings=full, device=device,
                     protocol=protocol or Protocol(), timeout_s=parse_duration(probe_timeout), seed=seed,
                     profile=profile, distributed=layout)
    return info, run_probe(spec, workdir, role="probe")
