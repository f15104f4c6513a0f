"""`analyze`: inspect the workload, start its record, pick the backend, plan and run probes, rank the findings, write
the reports. The steps are the functions below it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from .. import environment, executors, knobs, results, rules, rundir
from .. import workload as workload_mod
from ..collectors import designate, flops
from ..distributed import launch
from ..errors import UsageError
from ..planner import Outcome, PlanContext, Session, ablation, budget, compare, compile_cost, figures, plan
from ..planner.keep import DUEL_ROLE
from ..planner.ledger import ProbeLedger
from ..probe.backend import ProbeBackend, ProbeLimits
from ..probe.result import ProbeResult
from ..probe.spec import ProbeSpec
from ..render import write_reports
from ..script import flags
from ..results import RunRecord
from .inspection import INSPECT_TIMEOUT_S, Inspection, device_facts, inspect_workload
from .observer import AnalysisObserver, SilentObserver
from .options import AnalyzeOptions, memory_headroom


@dataclass
class Analysis:
    """What `analyze` found; `document` is the results.json it wrote."""

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
        return knobs.changes(self.recommended.settings, self.baseline.settings)


def analyze(path: str | Path, options: AnalyzeOptions | None = None,
            observer: AnalysisObserver | None = None) -> Analysis:
    """Plan and run probes for the workload file at `path`; write results.json and the reports; return the Analysis.

    One run at a time per output folder (a lock; a second gets UsageError). Ctrl-C (KeyboardInterrupt) stops the
    running probe, saves what finished as results.json and reports, and re-raises. `options.resume`: continue the
    run that the output folder holds, reusing its finished probes; refused (UsageError) when the workload file, the
    settings space or the hardware changed since.
    """
    started = time.monotonic()  # the budget covers the whole analysis, inspecting the workload included
    options, observer = options or AnalyzeOptions(), observer or SilentObserver()
    out_dir = prepare_out_dir(options.out or default_out_dir(path))
    workdir = out_dir / "probes"
    with rundir.locked(out_dir), _file_errors():
        rundir.remove_temp_files(out_dir)
        previous = _previous_run(out_dir / "results.json", observer.on_notice) if options.resume else None
        finished = rundir.finished_probes(previous, out_dir / "results.json") if previous else []
        device = environment.resolve_device(options.device)
        layout = launch.check(options.nproc_per_node, options.nnodes, options.rdzv_endpoint, device)  # DDP, or None
        remote = executors.connect(options.executor, options.ray_address, device, workdir)  # fails before inspecting
        script = script_mode(path, options, layout)
        inspect_s = budget.inspection_limit(options.budget, INSPECT_TIMEOUT_S,
                                            None if script is None else options.probe_timeout)
        inspecting = time.monotonic()
        info = inspect_workload(path, device, workdir, inspect_s, script=script, as_workload=script is None)
        inspected_s = time.monotonic() - inspecting
        memory = _memory_budget(options.max_memory, previous, device)
        record = _start_record(path, out_dir, options, info, device, layout, memory, previous)
        record.phase("inspection_s", inspected_s)
        backend = remote or executors.local_backend(device, layout, workdir, memory)
        # this machine's record of the workload's compile times (not a remote executor's machines')
        sha = None if remote else record.document["run"]["workload_sha256"]
        compile_times = None if sha is None else compile_cost.Recorder(sha, device_facts(device).type)
        session = _session(record, backend, ProbeSpecs(info, device, layout, options, observer), options.budget,
                           started, finished, observer, options.session_drift, compile_times=compile_times)
        record.phase("plan_started_s", time.monotonic() - started)  # this process's, resumed or not
        observer.on_start(info, session)
        capacity, margin = memory_headroom(options.max_memory, options.memory_margin,
                                           record.document["environment"].get("gpu"))
        record.document["budget"]["memory_margin_bytes"] = margin or None  # what a recommended batch leaves free
        ctx = PlanContext(baseline=info.baseline, search=info.search, workload=info.facts,
                          device=replace(device_facts(device), world_size=launch.world_size(layout),
                                         matmul_peaks=record.document["environment"]["peaks"]["flops_per_s"]),
                          memory_budget_bytes=memory, explore=options.only_knobs or None,
                          memory_capacity_bytes=capacity, memory_margin_bytes=margin, train_steps=options.train_steps,
                          workload_sha256=sha)
        planning = time.monotonic()
        try:
            outcome = plan(ctx, session, options.strategy)
        except KeyboardInterrupt:  # the running probe's group is killed already (probe.runner); keep what finished
            if not session.ledger.replaying:  # mid-replay the file on disk still holds every finished probe
                _interrupted(record, session, resuming=previous is not None)
                # a second Ctrl-C may cut this short: results.json is saved
                write_reports(record.document, out_dir, options.cost_per_hour)
            raise
        finally:
            backend.close()
        record.phase("plan_s", time.monotonic() - planning)
        _complete(record, outcome, session, options, resuming=previous is not None)
        reporting = time.monotonic()
        write_reports(record.document, out_dir, options.cost_per_hour)
        record.phase("reports_s", time.monotonic() - reporting)  # saved after the reports, which do not show it
        record.save()
        return Analysis(outcome.baseline, outcome.recommended, outcome.speedup, outcome.probes, outcome.notes,
                        outcome.unexplored, out_dir, record.document)


def script_mode(path: str | Path, options: AnalyzeOptions, layout: dict[str, Any] | None) -> dict[str, Any] | None:
    """The spec's `script` when the file is a plain training script (workload.is_script, or --script/--workload),
    else None; UsageError for script arguments given to a workload file. `home`: the caller's folder, which the
    script sees as its working directory (script/mirror.py); `world_size`: the ranks of a script written for
    torchrun (--nproc-per-node), which joins their group itself."""
    resolved = workload_mod.check_file(path)
    as_script = workload_mod.is_script(resolved) if options.as_script is None else options.as_script
    if not as_script:
        if options.script_args:
            raise UsageError(f"{path} is taken for a workload file (it defines build_model() or another entry point "
                             "taking no arguments), so it takes no arguments after --; arguments after -- are for a "
                             f"plain training script: add {workload_mod.FORCE_SCRIPT} to run it as one")
        return None
    return {"args": list(options.script_args), "map": flags.maps_to_json(options.maps),
            "cwd": None if options.script_cwd is None else str(options.script_cwd), "home": os.getcwd(),
            "world_size": launch.world_size(layout)}


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


def _memory_budget(max_memory: int | None, previous: dict[str, Any] | None, device: str) -> int | None:
    """The memory the batch ladder (and a lockstep pair) may use: --max-memory; else the one the interrupted run
    was planned with (the default depends on free memory); else on a CPU 80% of the memory available (past it the
    OOM killer takes the machine); None on a GPU."""
    import psutil

    if max_memory is None and previous:
        max_memory = previous.get("budget", {}).get("memory_budget_bytes")
    if max_memory is None and device == "cpu":
        max_memory = int(0.8 * psutil.virtual_memory().available)
    return max_memory


def _start_record(path: str | Path, out_dir: Path, options: AnalyzeOptions, info: Inspection, device: str,
                  layout: dict[str, Any] | None, memory: int | None, previous: dict[str, Any] | None) -> RunRecord:
    """The run's record, with the machine's peaks; saved, unless the file on disk holds an interrupted run's
    probes that this run resumes (UsageError when that run measured something else: another workload file,
    settings space or machine)."""
    identity = rundir.identity(info.path, {
        "device": device, "baseline": info.baseline, "search": info.search, "strategy": options.strategy,
        "protocol": dataclasses.asdict(options.protocol), "seed": options.seed,
        "max_memory_bytes": options.max_memory, "knobs": sorted(options.only_knobs) if options.only_knobs else None,
        "distributed": layout, **({"script": {k: info.script[k] for k in ("args", "map")}} if info.script else {}),
        **({"train_steps": options.train_steps} if options.train_steps else {})})
    record = RunRecord.start(
        out_dir / "results.json", command=list(options.command or sys.argv), environment=environment.collect(device),
        workload={"path": str(path), "model_class": info.facts.model_class, "parameters": info.facts.parameters,
                  "facts": vars(info.facts), "item_name": info.item_name, "search": info.search,
                  "framework": info.framework,
                  "kind": "script" if info.script else "framework" if info.framework else "functions",
                  **({"train_steps": options.train_steps} if options.train_steps else {}),
                  **({"script": {"args": info.script["args"], "map": info.script["map"],
                                 "cwd": info.script.get("cwd") or "scratch"}} if info.script else {})},
        limit_s=options.budget, memory_budget_bytes=memory,
        execution={"executor": options.executor, "distributed": layout}, identity=identity)
    if previous is not None:
        changed = rundir.changes(previous, identity, record.document["environment"]["fingerprint"])
        if changed:
            raise UsageError(f"--resume: cannot continue the run in {out_dir}: {'; '.join(changed)}, so its "
                             "probes do not measure this one. Run without --resume to start afresh (replacing "
                             "its results), or choose another folder with -o")
        record.continues(previous)
    # The roofline for MFU: measured once per machine and cached; children only read the cache. It counts
    # against the budget like everything else the user waits for, so it gets a small share of it.
    calibrating = time.monotonic()
    record.set_peaks(*flops.ensure_peaks(device, timeout_s=budget.calibration_limit(options.budget)))
    record.phase("calibration_s", time.monotonic() - calibrating)
    if previous is None or not previous["probes"]:  # resuming, it keeps them until the replay is over
        record.save()
    return record


@dataclass
class ProbeSpecs:
    """The Session's spec maker in an analysis: each probe's spec from the options, within the limits the budget
    sets it (planner/budget.py); the observer hears of the probe first."""

    info: Inspection
    device: str
    layout: dict[str, Any] | None
    options: AnalyzeOptions
    observer: AnalysisObserver

    def __post_init__(self):
        self.profiled = designate.ProfilePolicy(enabled=self.options.profile)  # the baseline and the recommended

    def __call__(self, probe_id: str, settings: dict[str, Any], role: str, limits: ProbeLimits) -> ProbeSpec:
        self.observer.on_probe_start(probe_id, settings, role)
        o = self.options
        return ProbeSpec(id=probe_id, workload=str(self.info.path), settings=settings, device=self.device,
                         protocol=limits.protocol(o.protocol), timeout_s=o.probe_timeout, seed=o.seed,
                         profile=self.profiled(role), count_flops=counts_flops(role), distributed=self.layout,
                         budget_left_s=limits.left_s, script=self.info.script, preload=self.info.preload)


def counts_flops(role: str) -> bool:
    """Whether a probe of `role` counts one step's FLOPs: not a duel's recheck, an ablation side or a confirmation
    round, whose settings an earlier probe measured and counted (the reports read each setting's count from its
    first probe that has one). Counted again in every confirmation probe, it was the phase a 1-minute
    hf_transformer run's second round was in when the budget stopped it."""
    return not (role == DUEL_ROLE or role.startswith((ablation.ROLE, "confirm")))


def _session(record: RunRecord, backend: ProbeBackend, make_spec: Callable[..., ProbeSpec], budget_s: float | None,
             started: float, finished: list[tuple[ProbeResult, float, dict]], observer: AnalysisObserver,
             session_drift: float | None = None, clock: Callable[[], float] = time.monotonic,
             compile_times: compile_cost.Recorder | None = None) -> Session:
    """The planner's session, probes through `backend` (`make_spec`: ProbeSpecs): each finished one is recorded,
    saved (not while a resumed run's probes are replayed: the file on disk holds them already) and shown to the
    observer. The plan's best so far is saved with it, provisional (`best_so_far`), and again as soon as the plan
    keeps a new best, so the file holds a recommendation, with its measured gain, long before the confirmation.
    `compile_times`: where each compiled probe's compile time is recorded for later runs (planner/compile_cost.py)."""
    saved = {id(result): entry for result, _, entry in finished}  # replayed probes are saved as they were

    def recorded(result: ProbeResult) -> None:
        elapsed = round(session.budget.elapsed(), 3)
        record.add_probe(saved.get(id(result)) or {**result.to_dict(), "elapsed_s": elapsed})
        record.spent(used_s=elapsed, probes_run=len(session.ledger.probes), unexplored=session.ledger.unexplored)
        _provisional(record, session)  # a probe of the baseline's or the best's settings refines its gain
        if not session.ledger.replaying:
            record.save()
            if compile_times is not None:
                compile_times.saw(result)
        observer.on_probe(result, session)

    def kept(best: ProbeResult) -> None:
        _provisional(record, session)
        if not session.ledger.replaying:
            record.save()

    # The budget ends when the last file is written: the planner stops where rules and reports still fit.
    session = Session(backend, budget.planning_limit(budget_s), on_probe=recorded, clock=clock, started=started,
                      finished=[(result, elapsed) for result, elapsed, _ in finished], make_spec=make_spec,
                      session_drift=session_drift)
    session.ledger.on_best = kept
    return session


def _provisional(record: RunRecord, session: Session) -> None:
    """The plan's best so far into the record (`best_so_far`, provisional): when it was kept is the time the record
    first saw that probe as the best, kept from one update to the next."""
    current = record.document.get("best_so_far") or {}
    best = _best_so_far(session.ledger, session.budget.elapsed())
    if best is not None and best["probe"] == current.get("probe") and "elapsed_s" in current:
        best["elapsed_s"] = current["elapsed_s"]
    record.provisional(best)


def _interrupted(record: RunRecord, session: Session, resuming: bool) -> None:
    """Ctrl-C before a recommendation: the probes that finished, saved, and how to go on."""
    ledger = session.ledger
    if resuming:
        record.resumed([p.id for p in ledger.reused], [p.id for p in ledger.discarded])
    _provisional(record, session)  # with the gain every finished probe gives it
    record.interrupted([f"interrupted after {len(ledger.probes)} probes, before a recommendation; "
                        "`tune-advisor analyze --resume` continues the run"], record.document.get("best_so_far"))
    record.save()


def _best_so_far(ledger: ProbeLedger, elapsed_s: float | None = None) -> dict[str, Any] | None:
    """The plan's best so far, with its gain over the baseline as the plan measured it (not confirmed; issue 21):
    provisional while the run goes on, what an interrupted run leaves; `elapsed_s`: when it was found. The baseline
    itself while nothing beat it; None before the baseline measured."""
    base, best = ledger.baseline, ledger.best
    if base is None or not base.ok:
        return None
    if best is None or not best.ok or best.settings == base.settings:
        return results.best_so_far(base, base, (1.0, 1.0, 1.0), elapsed_s)
    return results.best_so_far(base, best, compare.gain(ledger, base, best), elapsed_s)


def _complete(record: RunRecord, outcome: Outcome, session: Session, options: AnalyzeOptions,
              resuming: bool) -> None:
    """The plan is over: the recommendation, the figures, the rules' findings and the budget, saved."""
    ledger = session.ledger
    ledger.end_replay()
    if ledger.discarded:
        outcome.notes.append(f"resumed: the plan left the interrupted run's path at {ledger.discarded[0].id} "
                             f"(e.g. a different budget), so {len(ledger.discarded)} of its probes were not "
                             "reused")
    if resuming:
        record.resumed([p.id for p in ledger.reused], [p.id for p in ledger.discarded])
    if record.document["workload"].get("kind") == "script":  # where its batch size came from, what it wrote
        extra = record.document["workload"]["facts"].get("extra") or {}
        outcome.notes.extend(flags.script_notes(extra.get("script") or {}, record.document["probes"]))
    unit = outcome.baseline.unit
    shown = figures.figures(ledger.probes, outcome.baseline.settings, outcome.recommended.settings, outcome.speedup,
                            unit, session.session_drift)
    energy = figures.energy(ledger.probes, outcome.baseline.settings, outcome.recommended.settings, unit)
    record.complete(baseline=outcome.baseline.to_dict(), recommended=outcome.recommended.to_dict(),
                    speedup=outcome.speedup,
                    # both settings' best-founded throughputs, on one level with the speedup; GPU energy per item
                    figures={**shown, "energy": energy} if energy is not None else shown,
                    notes=outcome.notes, plan=outcome.plan_summary(), unconfirmed=outcome.unconfirmed)
    ruling = time.monotonic()
    record.set_findings(rules.evaluate(record.document, options.select, options.ignore))
    record.phase("rules_s", time.monotonic() - ruling)
    record.spent(used_s=round(session.budget.elapsed(), 3), probes_run=len(ledger.probes),
                 unexplored=outcome.unexplored)
    record.save()
