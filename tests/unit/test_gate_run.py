"""run_gate from input to verdict and gate.json, with the probes faked: settings, warnings, failures, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tune_advisor import api, environment, knobs, results
from tune_advisor.errors import UsageError
from tune_advisor.gate import baseline as bl
from tune_advisor.gate import run as run_mod
from tune_advisor.gate.measure import resolve_settings
from tune_advisor.probe.result import ProbeResult, Status
from tune_advisor.probe.spec import Protocol

from ..conftest import ROOT

ENV = {"device": "cpu", "device_name": "Xeon", "cpu_model": "Xeon", "cpu_count": 2, "torch": "2.13.0", "gpu": None,
       "fingerprint": "f"}
FILE_BASELINE = knobs.full_settings({"batch_size": 16})


def fake_probe(name: str, i: int, rate: float, status=Status.OK, settings=None) -> ProbeResult:
    rng = np.random.default_rng(i + (100 if name == "candidate" else 0))
    steps = list(16 / rate * (1 + rng.normal(0, 0.01, 30)))
    return ProbeResult(f"{name}-{i}", settings or FILE_BASELINE, status, error=None if status is Status.OK else
                       "fake failure", raw={"step_s": steps, "items": [16.0] * 30}, peak_memory_bytes=300 * 2**20)


@pytest.fixture
def fake(monkeypatch):
    """Probes at `rates[side]` items/s (default 1000; `round_rates[(side, round)]` for one round) ending with
    `status` (the reference always runs), no child process, no torch; records what was measured."""
    state = SimpleNamespace(rates={"candidate": 1000.0, "reference": 1000.0}, round_rates={}, status=Status.OK,
                            calls=[])
    info = api.Inspection(path=Path("w.py"), facts=knobs.WorkloadFacts(), baseline=dict(FILE_BASELINE), search={},
                          item_name="samples", optional=[])
    monkeypatch.setattr(environment, "resolve_device", lambda device: "cpu")
    monkeypatch.setattr(environment, "collect", lambda device: dict(ENV))
    monkeypatch.setattr(api, "inspect_workload", lambda *a, **k: info)
    monkeypatch.setattr(run_mod, "check_applicable", lambda *a: None)

    def measure(sides, rounds, start=0, **kwargs):
        state.calls.append({"sides": list(sides), "rounds": rounds, "start": start, "protocol": kwargs["protocol"],
                            "settings": {n: s for n, (_, s) in sides.items()}})
        return {name: [fake_probe(name, i + 1, state.round_rates.get((name, i + 1), state.rates.get(name, 1000.0)),
                                  Status.OK if name == "reference" else state.status, settings)
                       for i in range(start, start + rounds)] for name, (_, settings) in sides.items()}

    monkeypatch.setattr(run_mod, "measure", measure)
    return state


def stored_baseline(tmp_path, rate=1000.0, settings=None, env=None) -> Path:
    probes = [fake_probe("baseline", i, rate) for i in range(3)]
    doc = bl.new_document(command=[], environment=env or ENV, workload={"path": "w.py"},
                          settings=settings or FILE_BASELINE, protocol=Protocol(min_steps=7), probes=probes)
    path = tmp_path / "baseline.json"
    results.write_atomic(path, doc)
    return path


def test_an_unchanged_workload_passes_and_reuses_the_baselines_protocol(fake, tmp_path):
    # GIVEN a stored baseline at 1000 samples/s and a candidate at the same rate
    result = run_mod.run_gate("w.py", baseline=stored_baseline(tmp_path))
    # THEN both default checks pass, the candidate was measured like the baseline, and gate.json says so
    assert (result.verdict, result.exit_code) == ("pass", 0)
    assert [c["check"] for c in result.document["checks"]] == ["throughput:5%", "peak_memory:10%"]
    assert fake.calls[0]["protocol"].min_steps == 7 and fake.calls[0]["rounds"] == 3
    doc = json.loads(json.dumps(result.document))  # JSON-safe
    assert doc["mode"] == "stored" and doc["hardware"] == {"same": True, "differences": []}
    assert doc["reference"]["kind"] == "baseline" and len(doc["candidate"]["rounds"]) == 3
    assert result.message().startswith("passed: throughput:5%: throughput")


def test_a_slower_candidate_fails_every_check_it_breaks_in_one_message(fake, tmp_path):
    # GIVEN a candidate 20% slower, gated on throughput and step time
    fake.rates["candidate"] = 800.0
    result = run_mod.run_gate("w.py", baseline=stored_baseline(tmp_path), checks=["throughput:5%", "step_time:5%"])
    # THEN exit 1, and the message lists both failures with their numbers
    assert (result.verdict, result.exit_code) == ("fail", 1)
    assert len(result.failures) == 2
    assert result.message().startswith("2 of 2 checks failed:\n  - throughput:5%: throughput dropped 2")


def test_a_candidate_that_no_longer_runs_is_a_regression(fake, tmp_path):
    # GIVEN the code under test now runs out of memory at the gated settings
    fake.status = Status.OOM
    result = run_mod.run_gate("w.py", baseline=stored_baseline(tmp_path))
    # THEN every check fails, saying which round ended how
    assert result.exit_code == 1
    assert all("round 1 ended oom: fake failure" in line for line in result.failures)


def test_other_hardware_is_refused_before_anything_is_measured(fake, tmp_path):
    path = stored_baseline(tmp_path, env={**ENV, "cpu_count": 32})
    result = run_mod.run_gate("w.py", baseline=path)
    assert (result.verdict, result.exit_code) == ("refused", 3) and fake.calls == []
    assert "CPU cores: 32 (baseline) vs 2 (here)" in result.message()
    assert [c["status"] for c in result.document["checks"]] == ["not run", "not run"]


def test_allowing_other_hardware_compares_and_warns(fake, tmp_path):
    path = stored_baseline(tmp_path, env={**ENV, "cpu_count": 32})
    result = run_mod.run_gate("w.py", baseline=path, allow_other_hardware=True)
    assert result.exit_code == 0 and len(fake.calls) == 1
    assert any("different hardware" in w and "CPU cores 32 vs 2" in w for w in result.warnings)


def test_settings_default_to_the_baselines_and_a_difference_is_warned(fake, tmp_path):
    # GIVEN a baseline recorded at batch size 32 while the file's BASELINE says 16
    path = stored_baseline(tmp_path, settings=knobs.full_settings({"batch_size": 32}))
    run_mod.run_gate("w.py", baseline=path)
    # THEN without --settings the gate measures what the baseline measured
    assert fake.calls[-1]["settings"]["candidate"]["batch_size"] == 32
    # AND with --settings baseline it measures the file's BASELINE, and says the two differ
    result = run_mod.run_gate("w.py", baseline=path, settings=["baseline"])
    assert fake.calls[-1]["settings"]["candidate"]["batch_size"] == 16
    assert any("batch_size=32 there vs batch_size=16 here" in w for w in result.warnings)


def test_interleaved_mode_measures_the_ref_first_in_the_same_call(fake, tmp_path, monkeypatch):
    # GIVEN a ref whose version is faster than the working tree
    monkeypatch.setattr(run_mod, "workload_at_ref", lambda path, ref, dest: Path("ref/w.py"))
    fake.rates.update(reference=1000.0, candidate=700.0)
    result = run_mod.run_gate("w.py", against="main", checks=["throughput:10%"])
    # THEN both sides were measured together, the reference first, and the slowdown fails the gate
    assert fake.calls[0]["sides"] == ["reference", "candidate"]
    assert result.document["mode"] == "interleaved" and len(result.document["reference_rounds"]) == 3
    assert result.exit_code == 1 and "dropped 3" in result.failures[0]


def test_an_undecided_regression_measures_more_rounds_until_a_disturbed_round_no_longer_decides_it(
        fake, tmp_path, monkeypatch):
    # GIVEN a working tree 4x slower than its ref, and one of the first three rounds disturbed so that it read
    # 0.9x (as in a CI run: 0.261x [0.062, 1.166] over three rounds, a pass)
    monkeypatch.setattr(run_mod, "workload_at_ref", lambda path, ref, dest: Path("ref/w.py"))
    fake.rates.update(reference=1000.0, candidate=250.0)
    fake.round_rates[("candidate", 2)] = 900.0
    # WHEN the gate runs in its default 3 rounds
    result = run_mod.run_gate("w.py", against="main", checks=["throughput:20%"])
    # THEN the three left it undecided, so it measured one more round at a time until it was decided: a failure
    starts = [c["start"] for c in fake.calls]
    assert starts[0] == 0 and fake.calls[0]["rounds"] == 3 and all(c["rounds"] == 1 for c in fake.calls[1:])
    assert starts[1:] == list(range(3, 3 + len(starts) - 1)) and 2 <= len(starts) <= 5
    assert result.exit_code == 1, result.message()
    measured = 3 + len(starts) - 1
    assert f"over {measured} paired rounds" in result.failures[0]
    doc = result.document
    assert (doc["rounds"], doc["rounds_measured"], doc["max_rounds"]) == (3, measured, 7)
    assert [p["id"] for p in doc["reference_rounds"]] == [f"reference-{i}" for i in range(1, measured + 1)]
    # AND with --max-rounds equal to --rounds it measures no more, and says the drop was not significant
    fake.calls.clear()
    kept = run_mod.run_gate("w.py", against="main", checks=["throughput:20%"], max_rounds=3)
    assert len(fake.calls) == 1 and kept.exit_code == 0
    assert kept.outcomes[0].status == "warn" and "not significantly" in kept.outcomes[0].message


def test_a_decided_gate_measures_only_the_rounds_asked_for(fake, tmp_path, monkeypatch):
    # GIVEN a clear regression, and an unchanged workload
    monkeypatch.setattr(run_mod, "workload_at_ref", lambda path, ref, dest: Path("ref/w.py"))
    for rate, code in ((700.0, 1), (1000.0, 0)):
        fake.calls.clear()
        fake.rates["candidate"] = rate
        result = run_mod.run_gate("w.py", against="main", checks=["throughput:10%"])
        # THEN each is decided in its 3 rounds, with one call
        assert result.exit_code == code and len(fake.calls) == 1 and result.document["rounds_measured"] == 3


@pytest.mark.parametrize("rounds, max_rounds", [(3, 2), (3, 0), (3, 2.5)])
def test_max_rounds_below_the_rounds_is_a_usage_error(fake, rounds, max_rounds):
    with pytest.raises(UsageError, match="--max-rounds"):
        run_mod.run_gate("w.py", checks=["throughput:>=1"], rounds=rounds, max_rounds=max_rounds)


def test_a_candidate_that_fails_beside_its_reference_is_a_regression_not_a_broken_reference(fake, tmp_path,
                                                                                             monkeypatch):
    # GIVEN the working tree now runs out of memory, measured in lockstep beside the ref's version, which
    # probe/lockstep.py then stops (its partner ended)
    monkeypatch.setattr(run_mod, "workload_at_ref", lambda path, ref, dest: Path("ref/w.py"))
    fake.status = Status.OOM
    measure = run_mod.measure

    def in_lockstep(sides, rounds, **kwargs):
        measured = measure(sides, rounds, **kwargs)
        for ref, cand in zip(measured["reference"], measured["candidate"]):
            ref.status, ref.error = Status.STOPPED, f"stopped: its lockstep partner {cand.id} ended (oom)"
            ref.extra["lockstep"] = {"partner": cand.id, "partner_status": cand.status.value}
        return measured

    monkeypatch.setattr(run_mod, "measure", in_lockstep)
    # WHEN the gate runs against the ref
    result = run_mod.run_gate("w.py", against="main", checks=["throughput:10%"])
    # THEN it fails as a regression naming the candidate's round, not as a reference that does not run
    assert result.exit_code == 1
    assert all("round 1 ended oom: fake failure" in line for line in result.failures)


def test_a_noisy_baseline_is_flagged_as_unable_to_see_small_changes(fake, tmp_path):
    # GIVEN baseline rounds that scatter ±10%
    probes = [fake_probe("baseline", i, rate) for i, rate in enumerate((900.0, 1000.0, 1100.0))]
    doc = bl.new_document(command=[], environment=ENV, workload={}, settings=FILE_BASELINE, protocol=Protocol(),
                          probes=probes)
    results.write_atomic(tmp_path / "noisy.json", doc)
    result = run_mod.run_gate("w.py", baseline=tmp_path / "noisy.json", checks=["throughput:5%"])
    assert any("run-to-run spread (20.0%) exceeds the allowed change" in w for w in result.warnings)


# --settings, resolved against an inspected workload (only its BASELINE matters here)
INFO = SimpleNamespace(baseline=dict(FILE_BASELINE))


@pytest.mark.parametrize("spec, recorded, expected", [
    ([], None, {"batch_size": 16}),
    ([], {"batch_size": 32}, {"batch_size": 32}),
    (["baseline"], {"batch_size": 32}, {"batch_size": 16}),
    (["batch_size=64", "amp=bf16"], None, {"batch_size": 64, "amp": "bf16"}),
    (["batch_size=64,num_workers=2"], None, {"batch_size": 64, "num_workers": 2}),
])
def test_settings_forms(spec, recorded, expected):
    settings = resolve_settings(spec, INFO, recorded=recorded)
    assert {k: settings[k] for k in expected} == expected and set(settings) == set(knobs.KNOBS)


def test_recommended_settings_come_from_an_analysis():
    settings = resolve_settings(["recommended"], INFO, from_results=ROOT / "tests" / "golden" / "cnn.results.json")
    assert (settings["batch_size"], settings["amp"], settings["channels_last"]) == (64, "bf16", True)


@pytest.mark.parametrize("spec, from_results, says", [
    (["recommended"], None, "add --from-results"),
    (["batch_size"], None, "expected recommended, baseline, or KNOB=VALUE"),
    (["bach_size=64"], None, "did you mean 'batch_size'"),
    (["amp=fp8"], None, "'fp8' is not a valid value for amp"),
    (["recommended"], Path("/nonexistent/results.json"), "no such file"),
])
def test_bad_settings_are_usage_errors(spec, from_results, says):
    with pytest.raises(UsageError) as info:
        resolve_settings(spec, INFO, from_results=from_results)
    assert says in str(info.value)


def test_the_cli_exits_1_on_a_regression_and_every_output_carries_it(fake, tmp_path, cli, monkeypatch):
    # GIVEN a candidate 20% slower than its baseline, and CI's step summary file
    fake.rates["candidate"] = 800.0
    path = stored_baseline(tmp_path)
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step output\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    # WHEN the gate runs from the command line with every output
    result = cli("gate", "w.py", "--baseline", path, "-o", tmp_path / "out", "--junit", tmp_path / "j" / "gate.xml")
    # THEN it exits 1, prints the verdict, and gate.json, JUnit and the (appended) summary agree
    assert result.exit_code == 1, result.output
    assert "gate regression found" in result.output and "throughput dropped 2" in result.output
    assert json.loads((tmp_path / "out" / "gate.json").read_text())["verdict"] == "fail"
    assert 'failures="1"' in (tmp_path / "j" / "gate.xml").read_text()
    text = summary.read_text()
    assert text.startswith("earlier step output\n### ❌ tune-advisor gate: regression found")


def test_the_cli_json_output_is_gate_json(fake, tmp_path, cli):
    result = cli("gate", "w.py", "--baseline", stored_baseline(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["kind"] == "tune-advisor-gate"


def test_a_baseline_from_another_tune_advisor_version_is_compared_with_a_warning(fake, tmp_path):
    path = stored_baseline(tmp_path)
    doc = json.loads(path.read_text())
    doc["tool"]["version"] = "0.0.1"
    path.write_text(json.dumps(doc))
    result = run_mod.run_gate("w.py", baseline=path)
    assert result.exit_code == 0
    assert any("recorded by tune-advisor 0.0.1" in w for w in result.warnings)


def test_the_baseline_command_writes_the_rounds_and_reports_the_spread(fake, tmp_path, cli):
    # GIVEN a workload measured (fake) at 1000 samples/s
    out = tmp_path / "perf" / "baseline.json"
    # WHEN a baseline of 2 rounds is recorded into a folder that does not exist yet
    result = cli("baseline", "w.py", "-o", out, "--rounds", "2", "--settings", "batch_size=32")
    # THEN the file holds both rounds at the chosen settings, and the summary line shows rate and spread
    assert result.exit_code == 0, result.output
    doc = bl.read(out).document
    assert len(doc["rounds"]) == 2 and doc["settings"]["batch_size"] == 32
    assert "samples/s (rounds: " in result.output and "run-to-run spread" in result.output


def test_a_failed_round_writes_no_baseline(fake, tmp_path, cli):
    # GIVEN a workload whose probes crash
    fake.status = Status.CRASHED
    out = tmp_path / "baseline.json"
    # WHEN a baseline is recorded  THEN exit 2 says which round failed, and nothing is written
    result = cli("baseline", "w.py", "-o", out)
    assert result.exit_code == 2
    assert "baseline round 1 of 3" in result.output and "no baseline was written" in result.output
    assert not out.exists()


class Recording:
    """A ProbeBackend that records what the gate asks of it (`can_pair`: whether it measures pairs in lockstep)."""

    def __init__(self, can_pair: bool = True):
        self.can_pair, self.calls = can_pair, []

    def pair(self, specs, roles, first):
        self.calls.append(("pair", [s.id for s in specs], roles, first))
        return [ProbeResult(s.id, s.settings, Status.OK) for s in specs]

    def run(self, spec, role):
        self.calls.append(("single", spec.id, role))
        return ProbeResult(spec.id, spec.settings, Status.OK)


def test_the_gate_pairs_each_round_in_lockstep_and_alternates_who_starts(tmp_path, monkeypatch):
    from tune_advisor import executors
    from tune_advisor.gate import measure as measure_mod
    from tune_advisor.probe import lockstep

    # GIVEN the gate's measuring loop with a backend that records what it is asked
    info = SimpleNamespace(path=Path("w.py"), preload=[])
    kwargs = dict(device="cpu", protocol=Protocol(), timeout_s=60)
    backend = Recording()
    # WHEN two sides are measured in 3 rounds  THEN each round is one pair, the reference moving first every other
    measured = measure_mod.measure({"reference": (info, {}), "candidate": (info, {})}, 3, backend=backend, **kwargs)
    roles = ["gate:reference", "gate:candidate"]
    assert backend.calls == [("pair", [f"reference-{i}", f"candidate-{i}"], roles, first) for i, first in
                             ((1, 0), (2, 1), (3, 0))]
    assert [p.id for p in measured["candidate"]] == ["candidate-1", "candidate-2", "candidate-3"]
    # AND one more round of a gate still undecided goes on numbering, and alternating, where the others ended
    backend.calls.clear()
    measure_mod.measure({"reference": (info, {}), "candidate": (info, {})}, 1, start=3, backend=backend, **kwargs)
    assert backend.calls == [("pair", ["reference-4", "candidate-4"], roles, 1)]
    # AND one side (a baseline, or the stored mode) is measured round by round as before
    backend.calls.clear()
    measure_mod.measure({"baseline": (info, {})}, 2, backend=backend, **kwargs)
    assert backend.calls == [("single", "baseline-1", "gate:baseline"), ("single", "baseline-2", "gate:baseline")]
    # AND a backend that cannot pair (--executor ray) runs the two one after the other, the first alternating
    backend = Recording(can_pair=False)
    measured = measure_mod.measure({"reference": (info, {}), "candidate": (info, {})}, 2, backend=backend, **kwargs)
    assert backend.calls == [("single", "reference-1", "gate:reference"), ("single", "candidate-1", "gate:candidate"),
                             ("single", "candidate-2", "gate:candidate"), ("single", "reference-2", "gate:reference")]
    assert [p.id for p in measured["reference"]] == ["reference-1", "reference-2"]
    # AND this machine's gate backend pairs until each side's level is steady, one step a turn, and the side that
    # moves first forks from zygote slot 0 (a parent's bias flips with the order, as in the confirmation)
    asked = {}
    monkeypatch.setattr(lockstep, "run_pair", lambda specs, workdir, roles, **options: asked.update(options) or [])
    executors.gate_backend("local", None, "cpu", tmp_path).pair([], [], first=1)
    assert asked == {"first": 1, "noise": "each", "first_takes_slot0": True, "match_turns": False}


def test_every_gate_probe_forks_from_a_new_parent_process():
    from tune_advisor.gate import measure as measure_mod

    # GIVEN the gate measuring two sides, and one, in two rounds
    info = SimpleNamespace(path=Path("w.py"), preload=[])
    for sides, can_pair in ((("reference", "candidate"), True), (("reference", "candidate"), False),
                            (("baseline",), True)):
        backend = Recording(can_pair)
        asked = []
        backend.pair = lambda specs, roles, first: asked.extend(specs) or [ProbeResult(s.id, {}, Status.OK)
                                                                           for s in specs]
        backend.run = lambda spec, role: asked.append(spec) or ProbeResult(spec.id, {}, Status.OK)
        measure_mod.measure({name: (info, {}) for name in sides}, 2, backend=backend, device="cpu",
                            protocol=Protocol(), timeout_s=60)
        # THEN every probe of every round asks for a new parent: no layout offset repeats across rounds
        assert len(asked) == 2 * len(sides) and all(spec.fresh_parent for spec in asked), sides
