"""What the reports show, gathered once from a results.json document; the renderers only format it.

Every number here is read from the document (or is a ratio of two numbers read from it); nothing is estimated.
The builders are forgiving: a partial document (a run still going, one stopped early) renders with gaps, not errors.
"""

from __future__ import annotations

import itertools
import math
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

from .. import frameworks, knobs, snippets
from ..script import flags
from ..fmt import fmt_bytes, fmt_ci, fmt_later, fmt_seconds, fmt_speedup, fmt_value

FAILED = ("oom", "error", "timeout", "crashed", "diverged")
# Neither failures nor verdicts on a knob: cut short (the budget, a lockstep partner), or no kernel on this machine.
STOPPED, UNSUPPORTED = "stopped", "unsupported"

# The order the staircase prefers when several orders are equally well measured: cheap per-step wins first
# (precision, memory format), then the loader, then the knobs that change memory and optimisation.
STAIR_ORDER = ["amp", "matmul_precision", "channels_last", "cudnn_benchmark", "compile", "optimizer_impl",
               "pin_memory", "num_workers", "persistent_workers", "prefetch_factor", "checkpointing", "batch_size"]
_MAX_PERMUTED = 6  # beyond this many changes, take STAIR_ORDER instead of trying every order
FRAMEWORK_NAMES = {"hf": "Hugging Face Trainer (build_trainer)", "lightning": "Lightning (build_module)"}


def as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def as_num(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def is_ok(probe: Mapping | None) -> bool:
    if not probe or probe.get("status") != "ok":
        return False
    return as_num(as_dict(probe.get("throughput")).get("median")) is not None


def median_tp(probe: Mapping | None) -> float | None:
    return as_num(as_dict(as_dict(probe).get("throughput")).get("median"))


def settings_key(settings: Mapping) -> tuple:
    return tuple(sorted((str(k), repr(v)) for k, v in settings.items()))


@dataclass
class Row:
    """One probe, as the probe table shows it; raw numbers are kept for sorting."""

    probe: dict
    id: str
    role: str
    changed: str
    status: str
    error: str
    throughput: dict
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
class Step:
    """One stair: the changes so far, and the probe that measured exactly those settings (or None)."""

    label: str
    settings: dict
    probe: dict | None
    ratio: float | None  # this probe's median throughput over the baseline probe's

    @property
    def measured(self) -> bool:
        return is_ok(self.probe)


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
    speedup: Any
    time_saved_frac: float | None
    probes: list[str]


@dataclass
class Report:
    document: dict
    title: str
    unit: str
    baseline: dict | None
    recommended: dict | None
    changes: dict
    speedup: dict | None
    verdict: str  # one sentence: what happened
    snippet: str | None
    batch_note: str | None
    findings: list[Finding]
    staircase: list[Step]
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
    budget: dict
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

    @property
    def baseline_ok(self) -> bool:
        return is_ok(self.baseline)


def build(document: Mapping[str, Any]) -> Report:
    """Gather everything the reports show from one results.json document."""
    doc = dict(document) if isinstance(document, Mapping) else {}
    baseline = as_dict(doc.get("baseline")) or None
    recommended = as_dict(doc.get("recommended")) or None
    probes = [p for p in _list(doc.get("probes")) if isinstance(p, dict)]
    if baseline is None:  # a run still going: the first baseline probe stands in
        baseline = next((p for p in probes if p.get("role") == "baseline"), None)
    base_settings = as_dict(as_dict(baseline).get("settings"))
    changes = {}
    if is_ok(baseline) and is_ok(recommended):
        changes = {k: v for k, v in as_dict(recommended.get("settings")).items() if base_settings.get(k) != v}
    workload = as_dict(doc.get("workload"))
    unit = str(as_dict(as_dict(baseline).get("throughput")).get("unit") or
               f"{workload.get('item_name') or 'samples'}/s")
    rows = [_row(p, base_settings, baseline, recommended) for p in probes]
    budget = as_dict(doc.get("budget"))
    speedup = as_dict(doc.get("speedup")) or None
    if speedup:  # a hand-edited file may hold anything there: only numbers are shown as numbers
        speedup = {**speedup, **{k: as_num(speedup.get(k)) for k in ("median", "ci_low", "ci_high")}}
        if not isinstance(speedup.get("method"), str):
            speedup.pop("method", None)
        later = as_dict(speedup.get("later"))
        later = {**{k: as_num(later.get(k)) for k in ("ci_low", "ci_high")},
                 "interval": later.get("interval") if isinstance(later.get("interval"), str) else ""}
        speedup["later"] = later if None not in (later["ci_low"], later["ci_high"]) else None
    return Report(
        document=doc,
        title=_title(workload),
        unit=unit,
        baseline=baseline,
        recommended=recommended,
        changes=changes,
        speedup=speedup,
        verdict=_verdict(baseline, recommended, changes, probes, speedup),
        snippet=_snippet(recommended, base_settings, workload.get("framework")) if changes else None,
        batch_note=_batch_note(base_settings, changes, as_dict(workload.get("facts")).get("dataset_len"),
                               workload.get("framework")),
        findings=[_in_framework(_finding(f), base_settings, workload.get("framework"))
                  for f in _list(doc.get("findings")) if isinstance(f, dict)],
        staircase=staircase(baseline, recommended, probes),
        rows=rows,
        failed=[r for r in rows if r.status in FAILED],
        skipped=[r for r in rows if r.status == "skipped"],
        figures={side: _figure(doc, side) for side in ("baseline", "recommended")},
        stopped=[r for r in rows if r.status == STOPPED],
        unsupported=[r for r in rows if r.status == UNSUPPORTED],
        notes=[str(n) for n in _list(doc.get("notes"))],
        unexplored=[str(u) for u in _list(budget.get("unexplored"))],
        decisions=[str(d) for d in _list(as_dict(doc.get("plan")).get("decisions"))],
        frontier=_frontier(as_dict(as_dict(doc.get("plan")).get("frontier"))),
        budget=budget,
        environment=_environment(as_dict(doc.get("environment"))),
        workload=_workload(workload),
        command=_command(doc.get("command")),
        has_gpu=any(r.gpu_util is not None for r in rows),
        created=str(doc.get("created") or ""),
        version=str(as_dict(doc.get("tool")).get("version") or ""),
        run_command=_run_command(workload, base_settings, recommended)[0] if changes else None,
        run_command_rest=_run_command(workload, base_settings, recommended)[1] if changes else None,
    )


def _frontier(frontier: dict) -> str | None:
    if not frontier.get("largest_ok"):
        return None
    return (f"batch_size {frontier['largest_ok']} fits, {frontier.get('smallest_failed')} does not "
            f"({frontier.get('cause') or 'no cause recorded'})")


def _title(workload: dict) -> str:
    path, model = workload.get("path"), workload.get("model_class")
    if path and model:
        return f"{model} ({path})"
    return str(path or model or "unknown workload")


def _verdict(baseline, recommended, changes, probes, speedup) -> str:
    if not baseline:
        return ("No baseline measurement: the run stopped before its first probe finished." if not probes else
                "No baseline probe in this file.")
    if not is_ok(baseline):
        cause = baseline.get("error") or "no cause recorded"
        if baseline.get("status") == "stopped":  # cut short by the budget: not a failure of the workload
            return (f"The baseline probe did not finish ({cause}). Nothing can be compared with it; run again with "
                    "a longer --budget.")
        return (f"The baseline probe failed ({baseline.get('status')}): {cause}. "
                "Nothing can be compared with it; fix the workload and run again.")
    if not is_ok(recommended):
        return "The baseline was measured; no recommendation yet (the run stopped early or is still going)."
    if not changes:
        return "Keep your settings: no change beat the baseline by more than the measured noise."
    if speedup and as_num(speedup.get("median")) is not None:
        return (f"Change {knobs.describe(changes)}: {fmt_speedup(speedup)} faster, confirmed by measuring "
                f"baseline and recommended again, {_rounds_kind(speedup.get('method'))}.")
    return f"Change {knobs.describe(changes)} (not confirmed by measuring it again beside the baseline)."


def _rounds_kind(method: Any) -> str:
    """How the confirmation's rounds ran, from the speedup's method: lockstep pairs, or one side after the other
    (which a reader must not take for pairs measured together)."""
    method = str(method or "")
    if "lockstep" in method:
        return "together in lockstep rounds"
    if "one after the other" in method:
        return "one after the other in alternating rounds"
    return "in rounds"


def _snippet(recommended: dict, base: dict, framework: Any = None) -> str:
    """The "Apply it" code: a Trainer's or Lightning's own arguments when the workload handed one over."""
    settings = knobs.full_settings(as_dict(recommended.get("settings")))
    in_framework = frameworks.recommendation(framework, knobs.full_settings(base), settings)
    return in_framework if in_framework is not None else snippets.recommended(settings)


def _run_command(workload: dict, base: dict, recommended: dict) -> tuple[str | None, str | None]:
    """(`python train.py ARGS FLAGS` for a script whose mapped knobs the recommendation changes, what of the
    recommendation no flag sets), or (None, None)."""
    script = as_dict(workload.get("script"))
    if not script or not isinstance(workload.get("path"), str):
        return None, None
    try:
        maps = flags.maps_from_json(as_dict(script.get("map")))
        args = [str(a) for a in _list(script.get("args"))]
    except (KeyError, TypeError, ValueError):  # a hand-edited file: no command rather than a crash
        return None, None
    settings = as_dict(recommended.get("settings"))
    command = flags.command_line(workload["path"], args, maps, settings, base)
    rest = flags.unmapped_changes(maps, settings, base)
    return command, (f"{knobs.describe(rest)}: no flag of the script sets {'it' if len(rest) == 1 else 'these'}; "
                     f"apply {'it' if len(rest) == 1 else 'them'} in code (above)" if command and rest else None)


def _batch_note(base: dict, changes: dict, dataset_len: Any = None, framework: Any = None) -> str | None:
    old, new = base.get("batch_size"), changes.get("batch_size")
    if not isinstance(old, int) or not isinstance(new, int) or old <= 0 or new <= 0:
        return None
    in_framework = frameworks.batch_note(framework, base, {**base, **changes})
    if in_framework is not None:
        return in_framework
    return knobs.batch_change_note(old, new, dataset_len if isinstance(dataset_len, int) else None)


def _gpu_util(gpu: Any) -> float | None:
    """Mean GPU utilisation as a fraction, from the NVML summary's `util_mean` (a percentage, as NVML reports)."""
    value = as_num(as_dict(gpu).get("util_mean"))
    return value / 100 if value is not None else None


def _rank_utils(gpu: Any) -> list[float | None]:
    """Each rank's own GPU utilisation (fractions, rank order) for a probe that ran on more than one GPU."""
    ranks = [_gpu_util(r) if isinstance(r, dict) else None for r in _list(as_dict(gpu).get("ranks"))]
    return ranks if len(ranks) > 1 else []


def _row(p: dict, base_settings: dict, baseline, recommended) -> Row:
    st = as_dict(p.get("step_time_s"))
    samples = [x for x in _list(st.get("samples")) if as_num(x) is not None]
    return Row(
        probe=p, id=str(p.get("id", "")), role=str(p.get("role", "")),
        changed=knobs.describe(as_dict(p.get("settings")), base_settings or None),
        status=str(p.get("status", "")), error=str(p.get("error") or ""),
        throughput=as_dict(p.get("throughput")),
        step_median=as_num(st.get("median")), step_iqr=as_num(st.get("iqr")),
        step_mean=sum(samples) / len(samples) if samples else None,
        wait_frac=as_num(p.get("data_wait_frac")),
        peak_memory=p.get("peak_memory_bytes") if as_num(p.get("peak_memory_bytes")) else None,
        gpu_util=_gpu_util(p.get("gpu")),
        gpu_util_ranks=_rank_utils(p.get("gpu")),
        partner=_partner(p),
        is_baseline=baseline is not None and p.get("id") == baseline.get("id"),
        is_recommended=recommended is not None and p.get("id") == recommended.get("id"),
    )


def _figure(doc: dict, side: str) -> dict:
    """What the report prints for the baseline's or the recommendation's throughput, with the kind of interval."""
    figure = as_dict(as_dict(doc.get("figures")).get(side))
    probe = as_dict(doc.get(side))
    if as_num(figure.get("median")) is None:  # older files: the probe's own window
        figure = {**as_dict(probe.get("throughput")),
                  "interval": f"95% CI within one measured window ({probe.get('id', '?')})"}
    numbers = {k: as_num(figure.get(k)) for k in ("median", "ci_low", "ci_high")}
    unit = figure.get("unit") or as_dict(probe.get("throughput")).get("unit") or ""
    return {**numbers, "unit": str(unit), "interval": str(figure.get("interval") or "")}


def _partner(p: dict) -> str | None:
    partner = as_dict(as_dict(p.get("extra")).get("lockstep")).get("partner")
    return str(partner) if partner else None


def _finding(f: dict) -> Finding:
    gain, fix = as_dict(f.get("gain")), as_dict(f.get("fix"))
    measured = gain.get("measured")
    return Finding(
        code=str(f.get("code") or ""), name=str(f.get("name") or ""),
        severity=str(f.get("severity") or ""), message=str(f.get("message") or ""),
        evidence=list(as_dict(f.get("evidence")).items()),
        fix_settings=as_dict(fix.get("settings")), snippet=str(fix.get("snippet") or ""),
        measured=measured if isinstance(measured, bool) else None,
        speedup=gain.get("speedup"), time_saved_frac=as_num(gain.get("time_saved_frac")),
        probes=[str(p) for p in _list(f.get("probes"))],
    )


def _in_framework(finding: Finding, base: dict, framework: Any) -> Finding:
    """A finding's fix in the framework's own arguments, when the workload handed a Trainer or module over and the
    fix is settings (a fix that is only code, like torch.set_num_threads, stays as the rule wrote it)."""
    fix = finding.fix_settings
    if not fix or not all(k in knobs.KNOBS for k in fix):
        return finding
    settings = knobs.full_settings(base)
    text = frameworks.recommendation(framework, settings, {**settings, **fix})
    if text is not None:
        finding.snippet = text
    return finding


def staircase(baseline: dict | None, recommended: dict | None, probes: list[dict]) -> list[Step]:
    """Baseline, then the recommended changes added one at a time, each with the probe that measured it.

    Of all orders of the changes, the one with the most measured stairs wins (then: the most stairs with a
    probe, failed ones included; then STAIR_ORDER). A stair
    that no probe measured exactly has probe None: the reports say "not measured", never a guess.
    """
    if not is_ok(baseline) or not is_ok(recommended):
        return []
    base = dict(as_dict(baseline.get("settings")))
    changes = {k: v for k, v in as_dict(recommended.get("settings")).items() if base.get(k) != v}
    # The verdict's own probes stand for their settings; otherwise the first probe (in run order) that ran them.
    by_settings: dict[tuple, dict] = {}
    for p in [recommended, baseline, *probes]:
        key = settings_key(as_dict(p.get("settings")))
        if key not in by_settings or (not is_ok(by_settings[key]) and is_ok(p)):
            by_settings[key] = p

    def probe_for(order) -> list[dict | None]:
        found, settings = [], dict(base)
        for name in order:
            settings[name] = changes[name]
            found.append(by_settings.get(settings_key(settings)))
        return found

    rank = {name: i for i, name in enumerate(STAIR_ORDER)}
    canonical = sorted(changes, key=lambda k: (rank.get(k, len(rank)), k))
    order = canonical
    if 1 < len(changes) <= _MAX_PERMUTED:
        def score(o):  # most measured stairs, then most stairs with any probe (a failure says more than nothing)
            found = probe_for(o)
            return sum(map(is_ok, found)), sum(p is not None for p in found), [-rank.get(k, len(rank)) for k in o]

        order = list(max(itertools.permutations(canonical), key=score))
    base_tp = median_tp(baseline)
    steps = [Step("baseline", dict(base), baseline, 1.0)]
    settings = dict(base)
    for name, probe in zip(order, probe_for(order)):
        settings[name] = changes[name]
        tp = median_tp(probe) if is_ok(probe) else None
        steps.append(Step(f"+ {knobs.describe({name: changes[name]})}", dict(settings), probe,
                          tp / base_tp if tp is not None and base_tp else None))
    return steps


def _environment(env: dict) -> list[tuple[str, str]]:
    items = []
    for key in ("device", "device_name", "cpu_model", "cpu_count", "torch_threads", "torch", "python", "platform"):
        if env.get(key) not in (None, ""):
            items.append((key, str(env[key])))
    if env.get("cpu_flags"):
        items.append(("cpu_flags", ", ".join(map(str, _list(env["cpu_flags"])))))
    gpu = as_dict(env.get("gpu"))
    if gpu:
        for key, value in gpu.items():
            items.append((f"gpu.{key}", _fmt_env(key, value)))
    else:
        items.append(("gpu", "none"))
    known = {k for k, _ in items} | {"gpu", "cpu_flags", "fingerprint"}
    items += [(k, _fmt_env(k, v)) for k, v in env.items() if k not in known]
    if env.get("fingerprint"):
        items.append(("fingerprint", str(env["fingerprint"])))
    return items


def _fmt_env(key: str, value: Any) -> str:
    return fmt_bytes(value) if key.endswith("_bytes") else fmt_value(value)


def _workload(workload: dict) -> list[tuple[str, str]]:
    items = []
    for key in ("path", "model_class", "parameters", "item_name"):
        if workload.get(key) not in (None, ""):
            value = workload[key]
            items.append((key, f"{value:,}" if isinstance(value, int) else str(value)))
    framework = as_dict(workload.get("framework"))
    if framework.get("name"):
        items.append(("framework", FRAMEWORK_NAMES.get(str(framework["name"]), str(framework["name"]))))
    search = as_dict(workload.get("search"))
    if search:
        items.append(("search", "; ".join(f"{k}: {fmt_value(v)}" for k, v in search.items())))
    facts = as_dict(workload.get("facts"))
    for key in ("conv_layers", "repeated_blocks", "dataset_len", "batch_kind", "iterable_dataset"):
        if facts.get(key) not in (None, ""):
            items.append((key, fmt_value(facts[key])))
    return items


def _command(command: Any) -> str:
    """argv as a shell line, with this machine's path to the tool replaced by the name anyone can run."""
    if not isinstance(command, list) or not command:
        return str(command or "")
    argv = [str(c) for c in command]
    program = argv[0].replace("\\", "/")
    if program.rsplit("/", 1)[-1] == "tune-advisor":
        argv[0] = "tune-advisor"
    elif program.endswith("tune_advisor/__main__.py"):
        argv[0:1] = ["python", "-m", "tune_advisor"]
    return shlex.join(argv)


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


def compare(doc_a: Mapping, doc_b: Mapping, names: tuple[str, str] = ("A", "B")) -> Comparison:
    """Two runs side by side: settings, throughput, speedup, memory, findings."""
    a, b = build(doc_a), build(doc_b)

    def both(fn) -> tuple[str, str]:
        return fn(a), fn(b)

    rows = [
        ("workload", *both(lambda r: r.title)),
        ("created", *both(lambda r: r.created or "-")),
        ("device", *both(lambda r: " / ".join(v for k, v in r.environment if k in ("device", "device_name")))),
        ("fingerprint", *both(lambda r: str(as_dict(r.document.get("environment")).get("fingerprint") or "-"))),
        ("verdict", *both(lambda r: r.verdict)),
        ("baseline settings", *both(lambda r: knobs.describe(as_dict(as_dict(r.baseline).get("settings"))))),
        ("recommended changes", *both(lambda r: knobs.describe(r.changes) if r.changes else "(none)")),
        ("baseline throughput", *both(lambda r: fmt_ci(as_dict(r.baseline).get("throughput")))),
        ("recommended throughput", *both(lambda r: fmt_ci(as_dict(r.recommended).get("throughput")))),
        ("confirmed speedup", *both(lambda r: "; ".join(t for t in (fmt_speedup(r.speedup), fmt_later(r.speedup))
                                                        if t))),
        ("baseline peak memory", *both(lambda r: fmt_bytes(as_dict(r.baseline).get("peak_memory_bytes")))),
        ("recommended peak memory", *both(lambda r: fmt_bytes(as_dict(r.recommended).get("peak_memory_bytes")))),
        ("probes (failed)", *both(lambda r: f"{len(r.rows)} ({len(r.failed)})")),
        ("budget used", *both(lambda r: fmt_seconds(as_num(r.budget.get("used_s"))))),
    ]
    rec_a = as_dict(as_dict(a.recommended).get("settings")) if a.recommended else {}
    rec_b = as_dict(as_dict(b.recommended).get("settings")) if b.recommended else {}
    settings = [(k, fmt_value(rec_a.get(k)), fmt_value(rec_b.get(k)), rec_a.get(k) != rec_b.get(k))
                for k in dict.fromkeys([*rec_a, *rec_b])]
    codes_a = {f.code: f.name for f in a.findings}
    codes_b = {f.code: f.name for f in b.findings}
    findings = [(code, codes_a.get(code) or codes_b.get(code, ""),
                 "both" if code in codes_a and code in codes_b else "only A" if code in codes_a else "only B")
                for code in dict.fromkeys([*codes_a, *codes_b])]
    fp_a = as_dict(a.document.get("environment")).get("fingerprint")
    fp_b = as_dict(b.document.get("environment")).get("fingerprint")
    tp_a = median_tp(a.recommended) if is_ok(a.recommended) else None
    tp_b = median_tp(b.recommended) if is_ok(b.recommended) else None
    return Comparison(a, b, names, rows, settings, findings,
                      same_machine=(fp_a == fp_b) if fp_a and fp_b else None,
                      ratio=tp_b / tp_a if tp_a and tp_b is not None else None)
