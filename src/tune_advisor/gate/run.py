"""The gate and the baseline as functions: what `tune-advisor gate`/`baseline` and the pytest plugin call."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .. import __version__, api, environment, executors, knobs
from ..errors import UsageError, WorkloadError
from ..probe.spec import Protocol
from . import baseline as baseline_mod
from .checks import ERROR, FAIL, Check, Outcome, parse_checks
from .measure import OnProbe, check_applicable, measure, resolve_settings, workload_at_ref
from .verdict import INTERLEAVED, STORED, Evidence

EXIT_PASS, EXIT_REGRESSION, EXIT_UNUSABLE = 0, 1, 2
EXIT_OTHER_HARDWARE = baseline_mod.EXIT_OTHER_HARDWARE
DEFAULT_ROUNDS = 3
# An undecided check (beyond the allowed change, not significantly) measures one more round at a time up to this
# many: from seven the rounds' CI is the Hodges-Lehmann centre's own, stray rounds clipped (stats.WALSH_MIN_ROUNDS),
# so a round disturbed by a neighbour no longer decides alone. With three, one such round left a 4x slowdown at
# 0.261x [0.062, 1.166], a pass (CI, 2-core machine).
DEFAULT_MAX_ROUNDS = 7
DEFAULT_CHECKS = ("throughput:5%", "peak_memory:10%")
GATE_KIND = "tune-advisor-gate"
GATE_SCHEMA_VERSION = 1


@dataclass
class GateResult:
    """The verdict: pass, fail (a regression), error (a check could not be evaluated) or refused (other hardware)."""

    verdict: str
    exit_code: int
    outcomes: list[Outcome]
    warnings: list[str]
    document: dict[str, Any] = field(repr=False)
    reason: str = ""  # why the gate refused

    @property
    def failures(self) -> list[str]:
        return [f"{o.check.text}: {o.failure}" for o in self.outcomes if o.failure]

    def message(self) -> str:
        """One paragraph for a person: every failure, not just the first."""
        if self.verdict == "refused":
            return f"refused: {self.reason}"
        if not self.failures:
            return "passed: " + "; ".join(f"{o.check.text}: {o.message}" for o in self.outcomes)
        return f"{len(self.failures)} of {len(self.outcomes)} checks failed:\n" + "\n".join(
            f"  - {line}" for line in self.failures)


def record_baseline(path: str | Path, *, rounds: int = DEFAULT_ROUNDS, settings: Sequence[str] | None = None,
                    from_results: Path | None = None, device: str = "auto", protocol: Protocol | None = None,
                    probe_timeout: str | float = api.DEFAULT_PROBE_TIMEOUT_S, seed: int = 0,
                    command: list[str] | None = None, on_probe: OnProbe | None = None,
                    as_workload: bool = False) -> dict[str, Any]:
    """Measure `rounds` probes of the workload and return the baseline document (not yet written). `as_workload`:
    load a file that looks like a plain script as a workload (--workload)."""
    _check_rounds(rounds)
    protocol = protocol or Protocol()
    timeout_s = api.parse_duration(probe_timeout)
    device = environment.resolve_device(device)
    with tempfile.TemporaryDirectory(prefix="tune-advisor-baseline-") as tmp:
        info = api.inspect_workload(path, device, Path(tmp), as_workload=as_workload)
        chosen = resolve_settings(settings, info, from_results=from_results)
        check_applicable(chosen, info, device)
        backend = executors.gate_backend("local", None, device, Path(tmp))
        try:
            probes = measure({"baseline": (info, chosen)}, rounds, backend=backend, device=device,
                             protocol=protocol, timeout_s=timeout_s, seed=seed, on_probe=on_probe)["baseline"]
        finally:
            backend.close()
    failed = [p for p in probes if not p.ok]
    if failed:
        p = failed[0]
        raise WorkloadError(str(path), f"baseline round {probes.index(p) + 1} of {rounds} at "
                                       f"{knobs.describe(chosen, info.baseline)} ended {p.status.value}: {p.error}",
                            "fix the workload or choose settings that run (--settings); no baseline was written")
    return baseline_mod.new_document(
        command=command or sys.argv, environment=environment.collect(device),
        workload={"path": str(path), "model_class": info.facts.model_class, "parameters": info.facts.parameters,
                  "item_name": info.item_name},
        settings=chosen, protocol=protocol, probes=probes)


def run_gate(path: str | Path, *, baseline: str | Path | None = None, against: str | None = None,
             checks: Sequence[str] | None = None, settings: Sequence[str] | None = None,
             from_results: Path | None = None, rounds: int = DEFAULT_ROUNDS, max_rounds: int | None = None,
             device: str = "auto", protocol: Protocol | None = None,
             probe_timeout: str | float = api.DEFAULT_PROBE_TIMEOUT_S,
             allow_other_hardware: bool = False, seed: int = 0, command: list[str] | None = None,
             on_probe: OnProbe | None = None, executor: str = "local", ray_address: str | None = None,
             as_workload: bool = False) -> GateResult:
    """Re-measure the workload and judge every check. Unusable input raises (exit 2); everything else returns.
    `rounds` are measured first; while a check is undecided (`Outcome.undecided`), one more at a time up to
    `max_rounds` (default DEFAULT_MAX_ROUNDS, never below `rounds`). `executor`: where the probes run, local or ray
    (`ray_address`: the cluster to join), as analyze's."""
    _check_rounds(rounds)
    if max_rounds is not None and (not isinstance(max_rounds, int) or max_rounds < rounds):
        raise UsageError(f"--max-rounds {max_rounds}: expected a whole number of rounds, at least --rounds "
                         f"({rounds})")
    max_rounds = max(rounds, DEFAULT_MAX_ROUNDS) if max_rounds is None else max_rounds
    executors.check(executor, ray_address)
    has_reference = baseline is not None or against is not None
    parsed = parse_checks(list(checks) if checks else list(DEFAULT_CHECKS if has_reference else ()))
    if not parsed:
        raise UsageError("nothing to check: give --baseline FILE or --against REF (relative checks), or an "
                         "absolute check such as --check throughput:>=1200")
    relative = [c.text for c in parsed if c.needs_reference]
    if relative and not has_reference:
        raise UsageError(f"{', '.join(relative)} compare with a reference: give --baseline FILE (recorded with "
                         f"tune-advisor baseline) or --against REF (a git ref measured in this job)")
    stored = baseline_mod.read(baseline) if baseline is not None else None
    timeout_s = api.parse_duration(probe_timeout)
    device = environment.resolve_device(device)
    env = environment.collect(device)
    warnings: list[str] = []
    mode = INTERLEAVED if against else STORED if stored else None
    context = {"path": path, "checks": parsed, "env": env, "stored": stored, "against": against, "mode": mode,
               "rounds": rounds, "max_rounds": max_rounds, "command": command}

    differences = baseline_mod.differences(stored.environment, env) if stored and mode == STORED else []
    if differences:
        refusal = baseline_mod.OtherHardware(stored.path, differences)
        if not allow_other_hardware:
            return _result("refused", EXIT_OTHER_HARDWARE, [], warnings, reason=str(refusal), settings=None,
                           protocol=protocol, **context)
        warnings.append("compared across different hardware/software (--allow-other-hardware): " + "; ".join(
            f"{name} {old} vs {new}" for name, old, new in differences))
    protocol = protocol or (stored.protocol if stored else Protocol())
    recorded_by = ((stored.document.get("tool") or {}).get("version") if stored else None) or __version__
    if mode == STORED and recorded_by != __version__:
        warnings.append(f"the baseline was recorded by tune-advisor {recorded_by}, this is {__version__}: how "
                        f"memory and time are measured may differ; re-record the baseline after upgrading")

    with tempfile.TemporaryDirectory(prefix="tune-advisor-gate-") as tmp:
        workdir = Path(tmp)
        # The ref first: a ref missing from a shallow CI clone is the likeliest mistake, and it costs no probe.
        ref_path = workload_at_ref(Path(path), against, workdir / "ref") if against else None
        info = api.inspect_workload(path, device, workdir / "probes", as_workload=as_workload)
        chosen = resolve_settings(settings, info, from_results=from_results,
                                  recorded=stored.settings if stored else None)
        check_applicable(chosen, info, device)
        sides = {"candidate": (info, chosen)}
        if ref_path is not None:
            try:
                ref_info = api.inspect_workload(ref_path, device, workdir / "probes", as_workload=as_workload)
            except WorkloadError as exc:
                raise WorkloadError(f"{path} at {against}", exc.cause, exc.fix, exc.line) from None
            sides = {"reference": (ref_info, chosen), **sides}  # the reference goes first: A B, B A, ...
        backend = executors.gate_backend(executor, ray_address, device, workdir / "probes")
        try:
            def more(n: int, start: int = 0) -> dict[str, list]:
                return measure(sides, n, backend=backend, device=device, protocol=protocol, timeout_s=timeout_s,
                               seed=seed, start=start, on_probe=on_probe)

            measured = more(rounds)
            while len(measured["candidate"]) < max_rounds and _undecided(parsed, measured, stored, mode, seed):
                for side, probes in more(1, start=len(measured["candidate"])).items():
                    measured[side] += probes
        finally:
            backend.close()

    if stored and mode == STORED and stored.settings and knobs.full_settings(stored.settings) != chosen:
        warnings.append(f"the baseline was measured with other settings ("
                        f"{knobs.describe(knobs.full_settings(stored.settings), chosen)} there vs "
                        f"{knobs.describe(chosen, knobs.full_settings(stored.settings))} here)")
    # a reference stopped because the candidate beside it failed is the candidate's failure, judged below
    failed_ref = [p for p in measured.get("reference", []) if not p.ok and not p.stopped_by_partner]
    if failed_ref:
        raise WorkloadError(f"{path} at {against}", f"the reference probe ended {failed_ref[0].status.value}: "
                                                    f"{failed_ref[0].error}", "the gate needs a reference that runs")
    candidate = measured["candidate"]
    context.update(settings=chosen, protocol=protocol, probes=measured)
    failed = [p for p in candidate if not p.ok]
    if failed:
        # Code that no longer trains at the gated settings (an OOM, a crash) is the worst regression there is.
        why = f"the workload failed at the gated settings: round {candidate.index(failed[0]) + 1} ended " \
              f"{failed[0].status.value}: {failed[0].error}"
        outcomes = [Outcome(c, FAIL, why) for c in parsed]
        return _result("fail", EXIT_REGRESSION, outcomes, warnings, **context)

    evidence = _evidence(measured, stored, mode, seed)
    outcomes = [check.evaluate(evidence) for check in parsed]
    warnings += _noise_warnings(parsed, evidence)
    if any(o.status == ERROR for o in outcomes):
        verdict, code = "error", EXIT_UNUSABLE
    elif any(o.status == FAIL for o in outcomes):
        verdict, code = "fail", EXIT_REGRESSION
    else:
        verdict, code = "pass", EXIT_PASS
    return _result(verdict, code, outcomes, warnings, evidence=evidence, **context)


def _evidence(measured: dict[str, list], stored, mode: str | None, seed: int) -> Evidence:
    return Evidence(baseline_mod.sample_of(measured["candidate"]),
                    stored.sample() if mode == STORED else
                    baseline_mod.sample_of(measured["reference"]) if mode == INTERLEAVED else None,
                    mode, seed)


def _undecided(checks: list[Check], measured: dict[str, list], stored, mode: str | None, seed: int) -> bool:
    """Whether more rounds could decide a check: every probe ran (a failure is judged as it stands), and some
    check is beyond its allowed change or limit without being significantly so."""
    if not all(p.ok for probes in measured.values() for p in probes):
        return False
    evidence = _evidence(measured, stored, mode, seed)
    return any(check.evaluate(evidence).undecided for check in checks)


def _noise_warnings(checks: list[Check], evidence: Evidence) -> list[str]:
    """Say so when the measurement is too noisy to see a change of the size a check allows."""
    warnings = []
    if evidence.reference is None:
        return warnings
    if len(evidence.candidate.rounds) < 2 or len(evidence.reference.rounds) < 2:
        warnings.append("a side has a single round: its run-to-run spread is unknown, so the verdict rests on "
                        "step-to-step noise only; use --rounds 3 or more")
    for check in checks:
        if check.kind != "relative" or check.metric == "peak_memory":
            continue
        spread = max(evidence.candidate.spread(check.metric), evidence.reference.spread(check.metric))
        if evidence.mode == STORED and spread > check.threshold:
            warnings.append(f"{check.text}: the run-to-run spread ({spread:.1%}) exceeds the allowed change, so "
                            f"only larger regressions can be proven; measure longer (--min-time), add rounds, or "
                            f"compare in the same job (--against REF)")
    return warnings


def _check_rounds(rounds: int) -> None:
    if not isinstance(rounds, int) or rounds < 1:
        raise UsageError(f"--rounds {rounds}: expected a whole number of probes, 1 or more (3 recommended)")


def _result(verdict: str, code: int, outcomes: list[Outcome], warnings: list[str], *, path, checks, env, stored,
            against, mode, rounds, max_rounds, command, settings, protocol, probes=None, evidence=None,
            reason: str = "") -> GateResult:
    """The GateResult and its gate.json document (docs/results-json.md, "gate.json")."""
    probes = probes or {}
    differences = baseline_mod.differences(stored.environment, env) if stored and mode == STORED else []
    if against:
        reference = {"kind": "git-ref", "ref": against}
    elif stored:
        reference = {"kind": "baseline", "path": str(stored.path), "created": stored.document.get("created"),
                     "fingerprint": stored.environment.get("fingerprint"), "summary": stored.document.get("summary")}
    else:
        reference = None
    document = {
        "schema_version": GATE_SCHEMA_VERSION,
        "kind": GATE_KIND,
        "tool": {"name": "tune-advisor", "version": __version__},
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(command or sys.argv),
        "verdict": verdict,
        "exit_code": code,
        "reason": reason or None,
        "mode": mode,
        "workload": {"path": str(path)},
        "settings": settings,
        "protocol": dataclasses.asdict(protocol) if protocol else None,
        "rounds": rounds,
        "max_rounds": max_rounds,
        "rounds_measured": len(probes.get("candidate", [])),
        "reference": reference,
        "environment": env,
        "hardware": {"same": not differences,
                     "differences": [{"fact": n, "baseline": a, "current": b} for n, a, b in differences]},
        "checks": [o.to_dict() for o in outcomes] if outcomes else [
            {"check": c.text, "metric": c.metric, "kind": c.kind, "threshold": c.threshold, "status": "not run",
             "message": reason, "figures": {}} for c in checks],
        "warnings": list(warnings),
        "candidate": {"summary": baseline_mod.summary(evidence.candidate) if evidence else None,
                      "rounds": [p.to_dict() for p in probes.get("candidate", [])]},
        "reference_rounds": [p.to_dict() for p in probes.get("reference", [])],
    }
    return GateResult(verdict, code, outcomes, warnings, document, reason)
