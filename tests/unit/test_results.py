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
    assert again.step_s == raw["step_s"] and again.throughput() == probe.throughput()


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
