import json

import pytest

from tune_advisor import results
from tune_advisor.errors import UsageError
from tune_advisor.probe.result import ProbeResult, Status


def test_write_then_read_round_trips(tmp_path):
    doc = results.new_document(["tune-advisor", "analyze", "x.py"], {"device": "cpu"}, {"path": "x.py"})
    path = tmp_path / "results.json"
    results.write_atomic(path, doc)
    assert results.read(path) == doc
    assert not list(tmp_path.glob("*.tmp"))  # no temporary file left behind


def test_probe_dict_has_the_spec_keys_and_survives_a_round_trip():
    raw = {"step_s": [0.1, 0.1, 0.2], "items": [8.0, 8.0, 8.0], "data_wait_s": [0.05, 0.05, 0.1],
           "loss": [2.0, 1.9, 1.8]}
    probe = ProbeResult("p001", {"batch_size": 8}, Status.OK, raw=raw, peak_memory_bytes=123, wall_s=1.5)
    d = probe.to_dict()
    assert {"id", "settings", "status", "error", "throughput", "step_time_s", "data_wait_frac",
            "peak_memory_bytes", "loss", "gpu", "wall_s"} <= set(d)
    assert d["throughput"]["unit"] == "samples/s" and d["data_wait_frac"] == pytest.approx(0.5)
    assert d["loss"] == {"first": 2.0, "last": 1.8, "finite": True}
    again = ProbeResult.from_dict(json.loads(json.dumps(d)))
    assert again.step_s == raw["step_s"] and again.throughput() == pytest.approx(probe.throughput(), nan_ok=True)


def test_non_finite_loss_is_written_as_null_not_nan():
    probe = ProbeResult("p001", {}, Status.DIVERGED, raw={"loss": [2.0, float("nan")]})
    d = probe.to_dict()
    assert d["loss"] == {"first": 2.0, "last": None, "finite": False}
    json.dumps(d, allow_nan=False)  # strict JSON


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a readable results.json"),
    ('{"probes": []}', "no schema_version"),
    ('{"schema_version": 99}', "written by a newer tune-advisor"),
    # found by Hypothesis in CI: the summaries read the baseline's settings
    ('{"schema_version": 1, "probes": [], "baseline": {"id": "p001", "settings": null, "status": "ok"}}',
     "'baseline' needs a 'settings' object"),
    ('{"schema_version": 1, "probes": [], "recommended": {"id": "p001", "status": "ok"}}',
     "'recommended' needs a 'settings' object"),
])
def test_unreadable_results_give_clear_errors(tmp_path, content, message):
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        results.read(path)


def test_a_run_record_writes_the_document_in_the_order_readers_know(tmp_path):
    # GIVEN a run started, a probe recorded, then completed
    path = tmp_path / "results.json"
    record = results.RunRecord.start(path, command=["tune-advisor", "analyze", "x.py"],
                                     environment={"device": "cpu", "fingerprint": "f"}, workload={"path": "x.py"},
                                     limit_s=60.0, memory_budget_bytes=2**30,
                                     execution={"executor": "local", "distributed": None},
                                     identity={"workload_sha256": "h", "space": {}})
    record.continues({"run": {"resumed": [{"reused": ["p001"], "discarded": []}]}})
    record.set_peaks({"fp32": 1e12}, "measured")
    probe = ProbeResult("p001", {"batch_size": 8}, Status.OK, raw={"step_s": [0.1], "items": [8.0]}).to_dict()
    record.add_probe(probe)
    record.spent(used_s=1.5, probes_run=1, unexplored=["amp=bf16: over budget"])
    record.save()
    assert results.read(path)["run"]["state"] == "running" and results.read(path)["probes"] == [probe]
    record.resumed(["p001"], [])
    record.complete(baseline=probe, recommended=probe, speedup=None, figures={"baseline": None}, notes=["n"],
                    plan={"strategy": "adaptive"})
    record.set_findings([{"code": "TA101"}])
    record.spent(used_s=2.0, probes_run=1, unexplored=[])
    record.save()
    # THEN the file holds every part, in the order analyze has always written them
    saved = results.read(path)
    assert list(saved) == ["schema_version", "tool", "created", "command", "environment", "workload", "baseline",
                           "recommended", "speedup", "probes", "findings", "budget", "execution", "run", "figures",
                           "notes", "plan"]
    assert list(saved["run"]) == ["state", "workload_sha256", "space", "resumed"]
    assert saved["run"]["state"] == "complete"
    assert saved["run"]["resumed"] == [{"reused": ["p001"], "discarded": []}] * 2
    assert saved["environment"]["peaks"] == {"status": "measured", "flops_per_s": {"fp32": 1e12}}
    assert saved["budget"] == {"limit_s": 60.0, "used_s": 2.0, "probes_run": 1, "unexplored": [],
                               "memory_budget_bytes": 2**30}
    assert list(saved["budget"]) == ["limit_s", "used_s", "probes_run", "unexplored", "memory_budget_bytes"]
    # AND an interrupted run says so, with its note
    record.interrupted(["interrupted after 1 probes"])
    assert record.document["run"]["state"] == "interrupted"
    assert record.document["notes"] == ["interrupted after 1 probes"]
