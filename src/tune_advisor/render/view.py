"""What the reports show, gathered once from a results.json document; the renderers only format it.

Every number here is read from the document (or is a ratio of two numbers read from it); nothing is estimated.
The document is read as its typed record (record.py), so every value has the type its schema says; parts a run has
not reached (a run still going, one stopped early) are absent and render as gaps, not errors.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

from .. import consistency, frameworks, knobs, record, snippets
from ..planner import budget as budget_rules
from ..script import flags
from ..fmt import fmt_bytes, fmt_ci, fmt_later, fmt_rate, fmt_seconds, fmt_speedup, fmt_value

FAILED = ("oom", "error", "timeout", "crashed", "diverged")
# Neither failures nor verdicts on a knob: cut short (the budget, a lockstep partner), or no kernel on this machine.
STOPPED, UNSUPPORTED = "stopped", "unsupported"

# The staircase's order of the kept changes: cheap per-step wins first (precision, memory format), then the loader,
# then the knobs that change memory and optimisation.
STAIR_ORDER = ["amp", "matmul_precision", "channels_last", "cudnn_benchmark", "compile", "optimizer_impl",
               "pin_memory", "num_workers", "persistent_workers", "prefetch_factor", "checkpointing", "batch_size"]
CUDA_KNOBS = ("pin_memory", "cudnn_benchmark")  # settings that do nothing without a CUDA device
BATCH_CHANGE_CODE = "TA703"  # the finding that says what a batch-size change does to the optimisation
FRAMEWORK_NAMES = {"hf": "Hugging Face Trainer (build_trainer)", "lightning": "Lightning (build_module)"}
MORE_TIME_SHOWN = 3  # the untried settings the more-time line names before "and N more"


def is_ok(probe: record.Probe | None) -> bool:
    return probe is not None and probe.status == "ok" and probe.throughput.median is not None


def median_tp(probe: record.Probe | None) -> float | None:
    return probe.throughput.median if probe is not None else None


def settings_key(settings: Mapping) -> tuple:
    return tuple(sorted((str(k), repr(v)) for k, v in settings.items()))


def plain(part: record.Part | None) -> dict | None:
    """A typed part as the JSON object the formatters read (fmt.fmt_ci, fmt_speedup take mappings)."""
    return part.model_dump() if part is not None else None


@dataclass
class Row:
    """One probe, as the probe table shows it; raw numbers are kept for sorting."""

    probe: record.Probe
    id: str
    role: str
    changed: str
    status: str
    error: str
    throughput: dict  # the probe's throughput, as the formatters read it
    step_median: float | None
    step_iqr: float | None
    step_mean: float | None
    wait_frac: float | None
    peak_memory: int | None
    gpu_util: float | None
    gpu_util_ranks: list[float | None] = field(default_factory=list)  # a DDP probe's ranks, each on its own GPU
    partner: str | None = None  # measured step by step beside this probe (lockstep), not alone
    is_baseline: bool = False
    is_recommended: bool = False

    @property
    def ok(self) -> bool:
        return is_ok(self.probe)


@dataclass
class Stair:
    """One row of the staircase: a kept change and its own measured contribution (the ablation's ratio), the
    interaction left between their product and the confirmed speedup, or the confirmed total."""

    kind: str  # "change", "rest" (interaction, and changes not measured on their own) or "total"
    label: str
    change: dict  # the settings this row is about ({} for "rest")
    figure: dict | None  # {median, ci_low, ci_high}: the one figure this comparison is shown with
    cumulative: float | None  # the running product up to this row (the total's is the confirmed speedup)
    how: str = ""  # how the figure was measured (behind "how this was measured")


@dataclass
class Setting:
    """A knob as the settings table shows it."""

    knob: str
    baseline: Any
    recommended: Any
    changed: bool


@dataclass
class Energy:
    """The GPU's energy per item of the baseline and the recommendation (results.json `figures.energy`), shown only
    where both were measured: one clause of the verdict, one row of the figures, one line of how it was measured."""

    item: str  # what one item is: "sample", "token"
    baseline_j: float  # joules per item
    recommended_j: float
    ratio: float  # the recommendation's over the baseline's
    runs: tuple[list[str], list[str]]  # the probes each median is over

    @property
    def label(self) -> str:
        return f"energy per {self.item}"

    @property
    def change(self) -> str:
        """'312 → 253 mJ': both sides in one unit, the larger's."""
        scale, unit = next(((s, u) for s, u in ((1.0, "J"), (1e-3, "mJ"), (1e-6, "µJ"))
                            if max(self.baseline_j, self.recommended_j) >= s), (1e-6, "µJ"))
        return f"{_sig(self.baseline_j / scale)} → {_sig(self.recommended_j / scale)} {unit}"

    @property
    def clause(self) -> str:
        return f"{self.ratio:.2f}x the energy per {self.item} ({self.change})"

    @property
    def how(self) -> str:
        base, rec = self.runs
        return (f"the GPU's energy counter (NVML) over each measured window, per {self.item}: the median of the "
                f"baseline's {_count(base)} ({', '.join(base)}) and of the recommendation's {_count(rec)} "
                f"({', '.join(rec)}), measured alone; the whole board's energy, other processes on the GPU included")

    @property
    def shown(self) -> str:
        """Both figures as a report shows them (consistency.shown_contradictions compares every place)."""
        return f"{self.baseline_j:.3g} {self.recommended_j:.3g}"


@dataclass
class MoreTime:
    """The line of a run whose plan the budget cut: what more time would have tried, then the command of the thorough
    plan (planner/budget.py `more_time` decides both). Each renderer shows `lead`, then `command` as code."""

    untried: list[str]  # the settings, as the unexplored list names them
    budget: str  # the thorough plan's --budget ("10m")
    command: str  # the run's own command with that --budget; "--budget 10m" where the file records no command

    @property
    def lead(self) -> str:
        """'More time would have tried: amp, compile=default, pin_memory and 2 more. For the thorough plan, run:'."""
        shown, rest = self.untried[:MORE_TIME_SHOWN], len(self.untried) - MORE_TIME_SHOWN
        joint = "; " if any(", " in name for name in shown) else ", "  # a grid's combinations hold commas
        names = joint.join(shown) + (f" and {rest} more" if rest > 0 else "")
        said = f"More time would have tried: {names}." if names else "The budget cut the plan short."
        return f"{said} For the thorough plan, {'run again with' if self.command.startswith('--') else 'run:'}"

    @property
    def text(self) -> str:
        return f"{self.lead} {self.command}"


def _sig(value: float) -> str:
    """Three significant digits without an exponent (values from 1 to 999 after scaling)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _count(runs: list[str]) -> str:
    return f"{len(runs)} run{'s' if len(runs) != 1 else ''}"


@dataclass
class Finding:
    code: str
    name: str
    severity: str
    message: str
    evidence: list[tuple[str, Any]]
    fix_settings: dict
    snippet: str
    measured: bool | None
    speedup: Any  # a number, or {median, ci_low, ci_high}, as fmt_speedup reads it
    time_saved_frac: float | None
    probes: list[str]
    basis: str = ""  # how the gain was found (behind "how this was measured")
    change: str = ""  # the kept change whose staircase figure this finding quotes ("" for none)


@dataclass
class Report:
    document: record.Document
    title: str
    unit: str
    baseline: record.Probe | None
    recommended: record.Probe | None
    changes: dict
    speedup: dict | None  # as the formatters read it; `later` only where it has both bounds
    verdict: str  # one sentence: what happened
    snippet: str | None
    batch_note: str | None
    findings: list[Finding]  # measured gains first (largest first), then estimated, then the rest
    staircase: list[Stair]
    staircase_note: str  # what the staircase's rows are (`staircase_note`)
    rows: list[Row]
    failed: list[Row]
    skipped: list[Row]
    stopped: list[Row]
    unsupported: list[Row]
    # each side's best-founded throughput over all its runs (results.json `figures`); else its probe's window,
    # labelled as within one window
    figures: dict[str, dict]
    notes: list[str]
    unexplored: list[str]
    decisions: list[str]  # the planner's reasons: what it kept, dropped or skipped, and why
    frontier: str | None  # the batch-size memory frontier, in words
    budget: record.Budget
    environment: list[tuple[str, str]]
    workload: list[tuple[str, str]]
    command: str
    has_gpu: bool
    created: str = ""
    version: str = ""
    extras: dict = field(default_factory=dict)
    # script mode: the recommendation as the script's command line, through its mapped flags (None: no mapped
    # knob changed, or not a script)
    run_command: str | None = None
    run_command_rest: str | None = None  # the changes no flag of the script sets: the snippet's part to apply
    headline: str = ""  # the verdict in one plain sentence: what to change, how much faster
    caveat: str | None = None  # one line, only where it matters (the optimisation changes; a loss-parity refusal)
    epoch: list[tuple[str, str]] = field(default_factory=list)  # (what, "before → after"): throughput, epoch, cost
    settings_rows: list[Setting] = field(default_factory=list)  # the knobs that apply here
    mfu: list[tuple[str, str]] = field(default_factory=list)  # (side, MFU or why it was not measured)
    energy: Energy | None = None  # GPU energy per item of both sides, where both were measured
    more_time: MoreTime | None = None  # where the budget cut the plan: what more time would have tried, and how

    @property
    def baseline_ok(self) -> bool:
        return is_ok(self.baseline)


def build(document: record.Document | Mapping[str, Any], cost_per_hour: float | None = None) -> Report:
    """Gather everything the reports show from one results.json document (typed, or as JSON gives it: then it is
    typed here, and a document its schema rejects raises record.ValidationError). `cost_per_hour`: what an hour of
    the machine costs (--cost-per-hour), for an epoch's cost before and after."""
    doc = document if isinstance(document, record.Document) else record.parse(dict(document))
    baseline, recommended, probes, workload = doc.baseline, doc.recommended, doc.probes, doc.workload
    if baseline is None:  # a run still going: the first baseline probe stands in
        baseline = next((p for p in probes if p.role == "baseline"), None)
    base_settings = baseline.settings if baseline is not None else {}
    changes = {}
    if is_ok(baseline) and is_ok(recommended):
        changes = knobs.changes(recommended.settings, base_settings)
    unit = (baseline.throughput.unit if baseline is not None else None) or f"{workload.item_name or 'samples'}/s"
    rows = [_row(p, base_settings, baseline, recommended) for p in probes]
    framework = _framework(workload)
    run_command = _run_command(workload, base_settings, recommended) if changes else (None, None)
    stairs = staircase(doc, changes)
    findings = [_in_framework(_finding(f, doc, changes), base_settings, framework) for f in doc.findings]
    figures = {side: _figure(doc, side) for side in ("baseline", "recommended")}
    batch_note = _batch_note(base_settings, changes, workload.facts.dataset_len, framework)
    energy = _energy(doc, changes)
    more = budget_rules.more_time(doc.budget.unexplored, doc.budget.limit_s,
                                  [p.settings for p in probes if is_ok(p)], base_settings)
    return Report(
        document=doc,
        title=_title(workload),
        unit=unit,
        baseline=baseline,
        recommended=recommended,
        changes=changes,
        speedup=_speedup(doc.speedup),
        verdict=_verdict(baseline, recommended, changes, probes, doc.speedup, doc.best_so_far, energy,
                         running=doc.run is not None and doc.run.state == "running", unconfirmed=doc.unconfirmed),
        snippet=_snippet(recommended, base_settings, framework) if changes else None,
        batch_note=batch_note,
        findings=sorted(findings, key=_finding_order),
        staircase=stairs,
        staircase_note=staircase_note(stairs, changes),
        rows=rows,
        failed=[r for r in rows if r.status in FAILED],
        skipped=[r for r in rows if r.status == "skipped"],
        figures=figures,
        stopped=[r for r in rows if r.status == STOPPED],
        unsupported=[r for r in rows if r.status == UNSUPPORTED],
        notes=list(doc.notes),
        unexplored=list(doc.budget.unexplored),
        decisions=list(doc.plan.decisions),
        frontier=_frontier(doc.plan.frontier),
        budget=doc.budget,
        environment=_environment(doc.environment),
        workload=_workload(workload),
        command=_command(doc.command),
        has_gpu=any(r.gpu_util is not None for r in rows),
        created=doc.created or "",
        version=doc.tool.version if doc.tool is not None else "",
        run_command=run_command[0],
        run_command_rest=run_command[1],
        headline=_headline(changes, doc.speedup, is_ok(baseline) and is_ok(recommended), energy),
        caveat=_caveat(changes, batch_note, doc.notes),
        epoch=(_epoch(figures, workload.facts.dataset_len, unit, cost_per_hour)
               + ([(energy.label, energy.change)] if energy else [])) if changes else [],
        settings_rows=_settings_rows(doc, base_settings, recommended.settings if is_ok(recommended) else None,
                                     more.knobs if more else set()),
        mfu=_mfu(baseline, recommended, changes, probes),
        energy=energy,
        more_time=_more_time(doc.command, more) if more else None,
    )


def _framework(workload: record.Workload) -> dict | None:
    """`workload.framework` as frameworks/ reads it: {name, config}, or None for a plain workload."""
    return workload.framework.model_dump(exclude_unset=True) if workload.framework is not None else None


def _speedup(speedup: record.Speedup | None) -> dict | None:
    """The confirmed speedup as the formatters read it; `later` only where both its bounds were recorded."""
    if speedup is None:
        return None
    later = speedup.later
    shown = {**plain(speedup), "later": None}
    if later is not None and later.ci_low is not None and later.ci_high is not None:
        shown["later"] = {"ci_low": later.ci_low, "ci_high": later.ci_high, "interval": later.interval or ""}
    return shown


def _frontier(frontier: record.Frontier | None) -> str | None:
    if frontier is None or not frontier.largest_ok:
        return None
    return (f"batch_size {frontier.largest_ok} fits, {frontier.smallest_failed} does not "
            f"({frontier.cause or 'no cause recorded'})")


def _title(workload: record.Workload) -> str:
    path, model = workload.path, workload.model_class
    if path and model:
        return f"{model} ({path})"
    return str(path or model or "unknown workload")


def _verdict(baseline: record.Probe | None, recommended: record.Probe | None, changes: dict,
             probes: list[record.Probe], speedup: record.Speedup | None, best: record.BestSoFar | None = None,
             energy: Energy | None = None, running: bool = False, unconfirmed: record.Unconfirmed | None = None
             ) -> str:
    if baseline is None:
        return ("No baseline measurement: the run stopped before its first probe finished." if not probes else
                "No baseline probe in this file.")
    if not is_ok(baseline):
        cause = baseline.error or "no cause recorded"
        if baseline.status == "stopped":  # cut short by the budget: not a failure of the workload
            return (f"The baseline probe did not finish ({cause}). Nothing can be compared with it; run again with "
                    "a longer --budget.")
        return (f"The baseline probe failed ({baseline.status}): {cause}. "
                "Nothing can be compared with it; fix the workload and run again.")
    if not is_ok(recommended):
        return "The baseline was measured; no recommendation yet (the run stopped early or is still going)." + \
            _best_so_far(best, running)
    if not changes:
        return _unconfirmed(unconfirmed) or "Keep your settings: no change beat the baseline by more than the " \
                                            "measured noise."
    if speedup is not None and speedup.median is not None:
        if energy is not None:  # the energy figure comes from runs alone, not from the confirmation's rounds
            return (f"Change {knobs.describe(changes)}: {fmt_speedup(plain(speedup))} faster and {energy.clause}; "
                    f"the speedup confirmed by measuring baseline and recommended again, "
                    f"{_rounds_kind(speedup.method)}.")
        return (f"Change {knobs.describe(changes)}: {fmt_speedup(plain(speedup))} faster, confirmed by measuring "
                f"baseline and recommended again, {_rounds_kind(speedup.method)}.")
    return f"Change {knobs.describe(changes)} (not confirmed by measuring it again beside the baseline)."


def _unconfirmed(found: record.Unconfirmed | None) -> str:
    """The verdict of a run whose confirmation measured a winner it could not tell from the noise (results.json
    `unconfirmed`): what it measured, and whether more time would tell; '' where there was none."""
    if found is None or found.speedup is None or found.speedup.median is None or not found.changes:
        return ""
    more = "; a longer --budget would measure more rounds" if found.budget_short else ""
    return (f"Keep your settings for now: {knobs.describe(found.changes)} measured "
            f"{fmt_speedup(plain(found.speedup))} against them when measured again "
            f"{_rounds_kind(found.speedup.method)}, not beyond the noise{more}.")


def _best_so_far(best: record.BestSoFar | None, running: bool = False) -> str:
    """A stopped or still running run's best so far (results.json `best_so_far`), marked as not confirmed; '' where
    none."""
    if best is None:
        return ""
    if not best.changes:
        return " Nothing has beaten the baseline yet." if running else " Nothing had beaten the baseline when it stopped."
    ci = best.gain.ci if len(best.gain.ci) == 2 else [None, None]
    measured = fmt_speedup({"median": best.gain.median, "ci_low": ci[0], "ci_high": ci[1]})
    then = "the run goes on to confirm it" if running else "resume with --resume to confirm it"
    return (f" Best so far, not confirmed: {knobs.describe(best.changes)}, {measured} against the baseline "
            f"({best.probe}); {then}.")


def _headline(changes: dict, speedup: record.Speedup | None, measured: bool, energy: Energy | None = None) -> str:
    """The verdict in one sentence for a run with a measured recommendation: what to change, how much faster
    (the confirmed speedup and its 95% CI), and what it does to the GPU's energy per item where both sides read it.
    Empty where the verdict itself says what happened."""
    if not measured or not changes:
        return ""
    if speedup is not None and speedup.median is not None:
        ci = (f" (95% CI {speedup.ci_low:.2f}–{speedup.ci_high:.2f})"
              if speedup.ci_low is not None and speedup.ci_high is not None else "")
        return f"Change {knobs.describe(changes)}: {speedup.median:.2f}x faster{ci}" + \
            (f" and {energy.clause}." if energy is not None else ".")
    return f"Change {knobs.describe(changes)}: not yet confirmed by measuring it again beside the baseline."


def _caveat(changes: dict, batch_note: str | None, notes: list[str]) -> str | None:
    """One line, only where it matters: a batch size that changes the optimisation, or a change refused for
    changing the loss (loss parity)."""
    refused = [n.split(" changed the loss")[0] for n in notes if " changed the loss" in n]
    if refused:
        return (f"{' and '.join(refused)} changed the loss beyond the parity tolerance: not recommended, whatever "
                "the speed.")
    if batch_note and "batch_size" in changes and "optimisation is unchanged" not in batch_note:
        return batch_note.split(". ")[0].rstrip(".") + "."
    return None


def _energy(doc: record.Document, changes: dict) -> Energy | None:
    """The GPU's energy per item of both sides (results.json `figures.energy`), where both were measured and the
    recommendation changes something."""
    energy = doc.figures.energy if doc.figures is not None else None
    if not changes or energy is None or energy.baseline is None or energy.recommended is None:
        return None
    base, rec = energy.baseline.median, energy.recommended.median
    if not (base and rec and base > 0 and rec > 0):
        return None
    ratio = energy.ratio if energy.ratio is not None and energy.ratio > 0 else rec / base
    item = (energy.unit or "J/sample").split("/", 1)[-1] or "sample"
    return Energy(item, base, rec, ratio, (list(energy.baseline.runs), list(energy.recommended.runs)))


def _epoch(figures: dict[str, dict], dataset_len: int | None, unit: str,
           cost_per_hour: float | None) -> list[tuple[str, str]]:
    """What the speedup means for the user's run: throughput, one epoch of their dataset (its length over the
    throughput), and that epoch's cost at `cost_per_hour`, each as 'before → after'."""
    before, after = figures["baseline"].get("median"), figures["recommended"].get("median")
    if not before or not after:
        return []
    rows = [("throughput", f"{fmt_rate(before)} → {fmt_rate(after)} {unit}")]
    if dataset_len and unit.endswith("samples/s"):  # an epoch counts samples; tokens/s would need tokens per epoch
        rows.append((f"one epoch ({dataset_len:,} samples)",
                     f"{_duration(dataset_len / before)} → {_duration(dataset_len / after)}"))
        if cost_per_hour:
            cost = [dataset_len / tp / 3600 * cost_per_hour for tp in (before, after)]
            rows.append((f"cost of an epoch at {cost_per_hour:g}/h", f"{_money(cost[0])} → {_money(cost[1])}"))
    return rows


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def _money(amount: float) -> str:
    """Two decimals, or two significant digits below 0.01 (an epoch of a small dataset costs fractions of a cent)."""
    if amount >= 0.01 or amount <= 0:
        return f"{amount:.2f}"
    return f"{amount:.{1 - math.floor(math.log10(amount))}f}"


def _settings_rows(doc: record.Document, base: dict, rec: dict | None,
                   pending: set[str] = frozenset()) -> list[Setting]:
    """The knobs that apply on this device and layout: DDP knobs only for a DDP run, the loader workers' own
    knobs only with workers, and no knob every value of which away from the baseline was skipped as not
    applicable; changed knobs always, and those the budget kept the plan from trying (`pending`: more time would
    have, so they apply)."""
    distributed = doc.execution is not None and bool(getattr(doc.execution, "distributed", None))
    cuda = str(doc.environment.model_dump().get("device") or "").startswith("cuda")
    tried: dict[str, set[str]] = {}
    for p in doc.probes:
        for knob, value in p.settings.items():
            if base.get(knob) != value:
                tried.setdefault(knob, set()).add(p.status)
    rows, new_settings = [], rec if rec is not None else base
    for knob, value in base.items():
        new = new_settings.get(knob, value)
        changed = new != value
        inapplicable = ((knob in knobs.DDP_KNOBS and not distributed) or tried.get(knob) == {"skipped"}
                        or (knob in knobs.LOADER_KNOBS and not new_settings.get("num_workers"))
                        or (knob in CUDA_KNOBS and not cuda))
        if changed or knob in pending or not inapplicable:
            rows.append(Setting(knob, value, new, changed))
    return rows


def _mfu(baseline: record.Probe | None, recommended: record.Probe | None, changes: dict,
         probes: list[record.Probe]) -> list[tuple[str, str]]:
    """Model FLOPs utilisation of the baseline and the recommendation, or why it was not measured: from the
    side's own probe, else the first of `probes` with its settings that counted them (re-measurements do not)."""
    sides = [("baseline", baseline)] + ([("recommended", recommended)] if changes else [])
    shown = []
    for side, probe in sides:
        if probe is None:
            continue
        flops = _flops(probe) or next((_flops(p) for p in probes if p.settings == probe.settings and _flops(p)), {})
        if isinstance(flops.get("mfu"), (int, float)):
            share = f"{flops['mfu'] * 100:.1f}%" if flops["mfu"] >= 0.001 else "under 0.1%"
            text = f"{share} of the {flops.get('peak_dtype') or 'device'} peak"
        else:
            text = f"not measured: {flops.get('mfu_unavailable') or 'no FLOP count recorded'}"
        shown.append((side, text))
    return shown


def _flops(probe: record.Probe) -> Mapping[str, Any] | None:
    """The probe's FLOPs count (`extra.flops`), None where it has none."""
    flops = (probe.extra.model_extra or {}).get("flops") if hasattr(probe.extra, "model_extra") else None
    return flops if isinstance(flops, Mapping) and flops else None


def _rounds_kind(method: str | None) -> str:
    """How the confirmation's rounds ran, from the speedup's method: lockstep pairs, or one side after the other
    (which a reader must not take for pairs measured together)."""
    method = method or ""
    if "lockstep" in method:
        return "together in lockstep rounds"
    if "one after the other" in method:
        return "one after the other in alternating rounds"
    return "in rounds"


def _snippet(recommended: record.Probe, base: dict, framework: dict | None = None) -> str:
    """The "Apply it" code: a Trainer's or Lightning's own arguments when the workload handed one over."""
    settings = knobs.full_settings(recommended.settings)
    in_framework = frameworks.recommendation(framework, knobs.full_settings(base), settings)
    return in_framework if in_framework is not None else snippets.recommended(settings)


def _run_command(workload: record.Workload, base: dict,
                 recommended: record.Probe) -> tuple[str | None, str | None]:
    """(`python train.py ARGS FLAGS` for a script whose mapped knobs the recommendation changes, what of the
    recommendation no flag sets), or (None, None)."""
    script = workload.script
    if script is None or workload.path is None:
        return None, None
    try:
        maps = flags.maps_from_json(script.map)
    except (KeyError, TypeError, ValueError):  # a hand-edited map (open content: flags reads it): no command
        return None, None
    command = flags.command_line(workload.path, script.args, maps, recommended.settings, base)
    rest = flags.unmapped_changes(maps, recommended.settings, base)
    return command, (f"{knobs.describe(rest)}: no flag of the script sets {'it' if len(rest) == 1 else 'these'}; "
                     f"apply {'it' if len(rest) == 1 else 'them'} in code (above)" if command and rest else None)


def _batch_note(base: dict, changes: dict, dataset_len: int | None = None,
                framework: dict | None = None) -> str | None:
    old, new = base.get("batch_size"), changes.get("batch_size")
    if not isinstance(old, int) or not isinstance(new, int) or old <= 0 or new <= 0:
        return None
    in_framework = frameworks.batch_note(framework, base, {**base, **changes})
    if in_framework is not None:
        return in_framework
    return knobs.batch_change_note(old, new, dataset_len)


def _gpu_util(gpu: record.Gpu | record.GpuRank | None) -> float | None:
    """Mean GPU utilisation as a fraction, from the NVML summary's `util_mean` (a percentage, as NVML reports)."""
    return gpu.util_mean / 100 if gpu is not None and gpu.util_mean is not None else None


def _rank_utils(gpu: record.Gpu | None) -> list[float | None]:
    """Each rank's own GPU utilisation (fractions, rank order) for a probe that ran on more than one GPU."""
    ranks = [_gpu_util(r) for r in gpu.ranks] if gpu is not None and gpu.ranks else []
    return ranks if len(ranks) > 1 else []


def _row(p: record.Probe, base_settings: dict, baseline: record.Probe | None,
         recommended: record.Probe | None) -> Row:
    st = p.step_time_s
    return Row(
        probe=p, id=p.id, role=p.role,
        changed=knobs.describe(p.settings, base_settings or None),
        status=p.status, error=p.error or "",
        throughput=plain(p.throughput),
        step_median=st.median, step_iqr=st.iqr,
        step_mean=sum(st.samples) / len(st.samples) if st.samples else None,
        wait_frac=p.data_wait_frac,
        peak_memory=p.peak_memory_bytes or None,
        gpu_util=_gpu_util(p.gpu),
        gpu_util_ranks=_rank_utils(p.gpu),
        partner=(p.extra.lockstep.partner or None) if p.extra.lockstep is not None else None,
        is_baseline=baseline is not None and p.id == baseline.id,
        is_recommended=recommended is not None and p.id == recommended.id,
    )


def _figure(doc: record.Document, side: str) -> dict:
    """What the report prints for the baseline's or the recommendation's throughput, with the kind of interval."""
    figure: record.Figure | None = getattr(doc.figures, side) if doc.figures is not None else None
    probe: record.Probe | None = getattr(doc, side)
    measured = probe.throughput if probe is not None else record.Throughput()
    if figure is None or figure.median is None:  # older files: the probe's own window
        interval = f"95% CI within one measured window ({probe.id if probe is not None else '?'})"
        figure = record.Figure(**plain(measured), interval=interval)
    return {"median": figure.median, "ci_low": figure.ci_low, "ci_high": figure.ci_high,
            "unit": figure.unit or measured.unit or "", "interval": figure.interval or ""}


def _finding(f: record.Finding, doc: record.Document, changes: dict) -> Finding:
    """A finding as shown. One that fixes a single kept change quotes that change's staircase figure (the
    ablation's, consistency.kept_contribution: what newer runs' rules quote already), in its gain and where its
    message quoted another figure for it, so the report shows one figure for one comparison."""
    speedup = f.gain.speedup
    shown = plain(speedup) if isinstance(speedup, record.Interval) else speedup
    message, basis, change, saved = f.message, f.gain.basis or "", "", f.gain.time_saved_frac
    kept = _kept_figure(doc, f.fix.settings, changes) or _unconfirmed_figure(doc, f.fix.settings, changes)
    if kept is not None and f.gain.measured:
        if isinstance(shown, Mapping):
            message = message.replace(_quoted(shown), _quoted(kept))
        shown, basis, change = _interval(kept), kept["how"], knobs.describe(f.fix.settings)
        saved = 1 - 1 / kept["median"] if saved is not None and kept["median"] > 0 else saved  # as the rules word it
    return Finding(
        code=f.code, name=f.name, severity=f.severity, message=message,
        evidence=list(f.evidence.items()),
        fix_settings=f.fix.settings, snippet=f.fix.snippet,
        measured=f.gain.measured,
        speedup=shown,
        time_saved_frac=saved,
        probes=list(f.probes),
        basis=basis, change=change,
    )


def _kept_figure(doc: record.Document, fix: dict, changes: dict) -> dict | None:
    """The staircase's figure for `fix` when it is one kept change of the recommendation, else None."""
    if len(fix) != 1 or len(changes) < 1:
        return None
    (knob, value), = fix.items()
    if changes.get(knob) != value or knob not in changes:
        return None
    return _contribution(doc, knob, value, changes)


def _unconfirmed_figure(doc: record.Document, fix: dict, changes: dict) -> dict | None:
    """The confirmation's figure for `fix` where the baseline stayed and `fix` is the very change the confirmation
    could not tell from the noise (results.json `unconfirmed`), which the verdict quotes: a 1-minute cnn run's TA501
    read channels_last 1.03x [1.01, 1.07] over all its probes where its verdict read the confirmation's 1.10x
    [0.99, 1.19]. Else None."""
    found = doc.unconfirmed
    if changes or found is None or found.changes != fix or found.speedup is None or found.speedup.median is None:
        return None
    return {**_interval(plain(found.speedup)), "how": f"the confirmation, not beyond the noise: "
                                                      f"{found.speedup.method or 'method not recorded'}"}


def _contribution(doc: record.Document, knob: str, value: Any, changes: dict) -> dict | None:
    """A kept change's own figure: for a recommendation of that one change, the confirmed speedup (the same
    comparison); else the ablation's ratio. None where neither measured it."""
    speedup = doc.speedup
    if len(changes) == 1 and speedup is not None and speedup.median is not None:
        return {**_interval(plain(speedup)), "how": f"the confirmation: {speedup.method or 'method not recorded'}"}
    kept = consistency.kept_contribution({"plan": doc.plan.model_dump()}, knob, value)
    if kept is not None:
        beside = f" (added beside {kept['beside']})" if kept["beside"] else ""
        return {**_interval(kept), "how": (f"the recommendation with and without {knobs.describe({knob: value})}"
                                           f"{beside}, measured {kept['method'] or 'in a pair'} "
                                           f"({', '.join(kept['probes'])}); 95% CI")}
    return None


def _interval(figure: Mapping) -> dict:
    return {"median": figure.get("median"), "ci_low": figure.get("ci_low"), "ci_high": figure.get("ci_high")}


def _quoted(figure: Mapping) -> str:
    """A gain as the rules word it in their messages: '1.37x [1.25, 1.50]'."""
    if figure.get("ci_low") is None or figure.get("ci_high") is None:
        return f"{figure['median']:.2f}x"
    return f"{figure['median']:.2f}x [{figure['ci_low']:.2f}, {figure['ci_high']:.2f}]"


def _finding_order(f: Finding) -> tuple:
    """Measured gains first, largest first; then estimated ones (largest first); then findings without a gain."""
    gain = f.speedup.get("median") if isinstance(f.speedup, Mapping) else f.speedup
    gain = gain if isinstance(gain, (int, float)) else None
    rank = 2 if gain is None else 0 if f.measured else 1
    return rank, -(gain or 0)


def _in_framework(finding: Finding, base: dict, framework: dict | None) -> Finding:
    """A finding's fix in the framework's own arguments, when the workload handed a Trainer or module over and the
    fix is settings (a fix that is only code, like torch.set_num_threads, stays as the rule wrote it); the batch
    change's finding says what the framework's note says (its gradient accumulation may keep the effective batch)."""
    fix = finding.fix_settings
    if not fix or not all(k in knobs.KNOBS for k in fix):
        return finding
    settings = knobs.full_settings(base)
    text = frameworks.recommendation(framework, settings, {**settings, **fix})
    if text is not None:
        finding.snippet = text
    if finding.code == BATCH_CHANGE_CODE and framework is not None:  # what the batch change means, in its terms
        note = frameworks.batch_note(framework, settings, {**settings, **fix})
        finding.message = note or finding.message
    return finding


def staircase(doc: record.Document, changes: dict) -> list[Stair]:
    """The kept changes one at a time, each with its own measured contribution; then what their product leaves
    of the confirmed speedup (the interaction of the changes, and any change not measured on its own); then the
    confirmed speedup itself. The product of the rows is the confirmed speedup: one figure for the whole."""
    if not changes:
        return []
    rank = {name: i for i, name in enumerate(STAIR_ORDER)}
    stairs, product, unmeasured = [], 1.0, []
    for knob in sorted(changes, key=lambda k: (rank.get(k, len(rank)), k)):
        figure = _contribution(doc, knob, changes[knob], changes)
        label = knobs.describe({knob: changes[knob]})
        if figure is None:
            unmeasured.append(label)
            continue
        product *= figure["median"]
        stairs.append(Stair("change", f"+ {label}", {knob: changes[knob]}, _interval(figure), product, figure["how"]))
    confirmed = plain(doc.speedup) if doc.speedup is not None and doc.speedup.median is not None else None
    if confirmed is None:
        return stairs
    rest = confirmed["median"] / product
    # no change measured on its own: the confirmed row alone says what they bought, once
    if unmeasured and stairs:
        label = f"{', '.join(unmeasured)} and the interaction"
        stairs.append(Stair("rest", label, {}, {"median": rest},
                            confirmed["median"], f"{', '.join(unmeasured)}: not measured on "
                            f"{'its' if len(unmeasured) == 1 else 'their'} own; the confirmed speedup divided by "
                            "the product of the rows above"))
    elif not unmeasured and len(stairs) > 1 and abs(rest - 1) >= 0.005:
        stairs.append(Stair("rest", "interaction", {}, {"median": rest}, confirmed["median"],
                            "the changes together against the product of their separate contributions: the "
                            "confirmed speedup divided by the product of the rows above"))
    how = f"the confirmation: {confirmed.get('method') or 'method not recorded'}"
    stairs.append(Stair("total", "recommended (confirmed)", dict(changes), _interval(confirmed), confirmed["median"],
                        how))
    return stairs


def staircase_note(stairs: list[Stair], changes: dict) -> str:
    """What the staircase's rows are: each kept change's own contribution, or, where none was measured on its own
    (the budget left no ablation pair, or the strategy has none), what the changes bought together."""
    if any(s.kind == "change" for s in stairs) or len(changes) < 2:
        return ("Each kept change's own contribution, measured as the recommendation with and without it; the "
                "product of the rows is the confirmed speedup (a row \"interaction\" says how far the changes "
                "together differ from the product of their separate contributions).")
    return (f"The {len(changes)} changes were not measured one at a time (see how the planner decided): the row is "
            "what they bought together, the confirmed speedup, and says nothing of each one's share.")


def _environment(env: record.Environment) -> list[tuple[str, str]]:
    """The machine, key by key: the usual facts first, then every other key the document holds (the schema leaves
    the environment open, so the keys are listed as written rather than named here)."""
    written = env.model_dump(exclude_unset=True)
    items = []
    for key in ("device", "device_name", "cpu_model", "cpu_count", "torch_threads", "torch", "python", "platform"):
        if written.get(key) not in (None, ""):
            items.append((key, str(written[key])))
    if env.cpu_flags:
        items.append(("cpu_flags", ", ".join(env.cpu_flags)))
    if written.get("gpu"):
        for key, value in written["gpu"].items():
            items.append((f"gpu.{key}", _fmt_env(key, value)))
    else:
        items.append(("gpu", "none"))
    known = {k for k, _ in items} | {"gpu", "cpu_flags", "fingerprint"}
    items += [(k, _fmt_env(k, v)) for k, v in written.items() if k not in known]
    if env.fingerprint:
        items.append(("fingerprint", env.fingerprint))
    return items


def _fmt_env(key: str, value: Any) -> str:
    return fmt_bytes(value) if key.endswith("_bytes") else fmt_value(value)


def _workload(workload: record.Workload) -> list[tuple[str, str]]:
    items = []
    for key in ("path", "model_class", "parameters", "item_name"):
        value = getattr(workload, key)
        if value not in (None, ""):
            items.append((key, f"{value:,}" if isinstance(value, int) else value))
    if workload.framework is not None:
        name = workload.framework.name
        items.append(("framework", FRAMEWORK_NAMES.get(name, name)))
    if workload.search:
        items.append(("search", "; ".join(f"{k}: {fmt_value(v)}" for k, v in workload.search.items())))
    facts = workload.facts
    for key in ("conv_layers", "repeated_blocks", "dataset_len", "batch_kind", "iterable_dataset"):
        value = getattr(facts, key)
        if value not in (None, ""):
            items.append((key, fmt_value(value)))
    return items


def _more_time(command: list[str], more: budget_rules.MoreTime) -> MoreTime:
    """The line of a plan the budget cut, with the run's own command (`command`, its argv) given more time where
    that was tune-advisor's; an API run records its own program's argv (a benchmark's, a notebook's), which takes
    no --budget: it gets the option alone."""
    ours = bool(command) and _program(command) is not None
    shown = _command(_with_budget(command, more.budget)) if ours else f"--budget {more.budget}"
    return MoreTime(more.untried, more.budget, shown)


def _program(command: list[str]) -> list[str] | None:
    """How anyone runs the tool that `command` (an argv) ran: ["tune-advisor"] or ["python", "-m", "tune_advisor"];
    None where argv[0] is another program."""
    program = command[0].replace("\\", "/")
    if program.rsplit("/", 1)[-1] == "tune-advisor":
        return ["tune-advisor"]
    if program.endswith("tune_advisor/__main__.py"):
        return ["python", "-m", "tune_advisor"]
    return None


def _with_budget(argv: list[str], budget: str) -> list[str]:
    """`argv` (analyze's command line) with `budget` as its --budget: in place of its own, else added before a
    script's arguments (after `--`), which would take it as theirs."""
    end = argv.index("--") if "--" in argv else len(argv)
    own, rest = list(argv[:end]), list(argv[end:])
    for i, arg in enumerate(own):
        if arg == "--budget" and i + 1 < end:
            return own[:i + 1] + [budget] + own[i + 2:] + rest
        if arg.startswith("--budget="):
            return own[:i] + [f"--budget={budget}"] + own[i + 1:] + rest
    return own + ["--budget", budget] + rest


def _command(command: list[str]) -> str:
    """argv as a shell line, with this machine's path to the tool replaced by the name anyone can run."""
    if not command:
        return ""
    return shlex.join((_program(command) or command[:1]) + list(command[1:]))


# --- two runs side by side ------------------------------------------------------------------------------------


@dataclass
class Comparison:
    a: Report
    b: Report
    names: tuple[str, str]
    rows: list[tuple[str, str, str]]  # (what, run A, run B)
    settings: list[tuple[str, str, str, bool]]  # (knob, A recommended, B recommended, differs)
    findings: list[tuple[str, str, str]]  # (code, name, where: "both", "only A", "only B")
    same_machine: bool | None
    ratio: float | None  # B's recommended median throughput over A's (separate runs: no CI)


def compare(doc_a: record.Document | Mapping, doc_b: record.Document | Mapping,
            names: tuple[str, str] = ("A", "B")) -> Comparison:
    """Two runs side by side: settings, throughput, speedup, memory, findings."""
    a, b = build(doc_a), build(doc_b)

    def both(fn) -> tuple[str, str]:
        return fn(a), fn(b)

    rows = [
        ("workload", *both(lambda r: r.title)),
        ("created", *both(lambda r: r.created or "-")),
        ("device", *both(lambda r: " / ".join(v for k, v in r.environment if k in ("device", "device_name")))),
        ("fingerprint", *both(lambda r: r.document.environment.fingerprint or "-")),
        ("verdict", *both(lambda r: r.verdict)),
        ("baseline settings", *both(lambda r: knobs.describe(r.baseline.settings if r.baseline else {}))),
        ("recommended changes", *both(lambda r: knobs.describe(r.changes) if r.changes else "(none)")),
        ("baseline throughput", *both(lambda r: fmt_ci(plain(r.baseline and r.baseline.throughput)))),
        ("recommended throughput", *both(lambda r: fmt_ci(plain(r.recommended and r.recommended.throughput)))),
        ("confirmed speedup", *both(lambda r: "; ".join(t for t in (fmt_speedup(r.speedup), fmt_later(r.speedup))
                                                        if t))),
        ("baseline peak memory", *both(lambda r: fmt_bytes(r.baseline and r.baseline.peak_memory_bytes))),
        ("recommended peak memory", *both(lambda r: fmt_bytes(r.recommended and r.recommended.peak_memory_bytes))),
        ("probes (failed)", *both(lambda r: f"{len(r.rows)} ({len(r.failed)})")),
        ("budget used", *both(lambda r: fmt_seconds(r.budget.used_s))),
    ]
    rec_a = a.recommended.settings if a.recommended else {}
    rec_b = b.recommended.settings if b.recommended else {}
    settings = [(k, fmt_value(rec_a.get(k)), fmt_value(rec_b.get(k)), rec_a.get(k) != rec_b.get(k))
                for k in dict.fromkeys([*rec_a, *rec_b])]
    codes_a = {f.code: f.name for f in a.findings}
    codes_b = {f.code: f.name for f in b.findings}
    findings = [(code, codes_a.get(code) or codes_b.get(code, ""),
                 "both" if code in codes_a and code in codes_b else "only A" if code in codes_a else "only B")
                for code in dict.fromkeys([*codes_a, *codes_b])]
    fp_a, fp_b = a.document.environment.fingerprint, b.document.environment.fingerprint
    tp_a = median_tp(a.recommended) if is_ok(a.recommended) else None
    tp_b = median_tp(b.recommended) if is_ok(b.recommended) else None
    return Comparison(a, b, names, rows, settings, findings,
                      same_machine=(fp_a == fp_b) if fp_a and fp_b else None,
                      ratio=tp_b / tp_a if tp_a and tp_b is not None else None)
