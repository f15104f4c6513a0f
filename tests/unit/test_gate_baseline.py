"""perf/baseline.json: round trip, unusable files rejected with a clear message, machines compared fact by fact."""

from __future__ import annotations

import json

import pytest

from tune_advisor.errors import UsageError
from tune_advisor.gate import baseline as bl
from tune_advisor.probe.result import ProbeResult, Status
from tune_advisor.probe.spec import Protocol

CPU_ENV = {"device": "cpu", "device_name": "Xeon", "cpu_model": "Xeon", "cpu_count": 2, "torch": "2.13.0",
           "gpu": None, "fingerprint": "abc"}
GPU_ENV = {"device": "cuda", "device_name": "NVIDIA H100", "cpu_model": "EPYC", "cpu_count": 16, "torch": "2.13.0",
           "gpu": {"name": "NVIDIA H100", "driver": "550.54", "memory_total_bytes": 80 * 2**30, "cuda": "12.4"}}


def probe(i: int, rate: float = 1000.0, status: Status = Status.OK) -> ProbeResult:
    steps = [16 / rate] * 10
    return ProbeResult(f"baseline-{i}", {"batch_size": 16}, status, raw={"step_s": steps, "items": [16.0] * 10},
                       peak_memory_bytes=300 * 2**20 + i)


def document(**over):
    doc = bl.new_document(command=["tune-advisor", "baseline"], environment=CPU_ENV, workload={"path": "w.py"},
                          settings={"batch_size": 16}, protocol=Protocol(min_steps=5),
                          probes=[probe(1, 990), probe(2, 1010), probe(3, 1000)])
    doc.update(over)
    return doc


def test_a_written_baseline_reads_back_with_its_rounds_protocol_and_spread(tmp_path):
    # GIVEN a baseline document of three rounds, written as JSON
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(document()))
    # WHEN it is read
    baseline = bl.read(path)
    # THEN the rounds, the protocol and the summary survive, and the verdict sample has every round
    assert len(baseline.sample().rounds) == 3
    assert baseline.protocol.min_steps == 5
    assert baseline.settings == {"batch_size": 16}
    summary = baseline.document["summary"]
    assert summary["throughput"]["median"] == pytest.approx(1000, rel=1e-6)
    assert summary["throughput"]["spread"] == pytest.approx(0.02, abs=1e-3)
    assert summary["peak_memory_bytes"]["rounds"] == [300 * 2**20 + 1, 300 * 2**20 + 2, 300 * 2**20 + 3]


def test_keys_added_later_get_defaults(tmp_path):
    # GIVEN an older baseline without protocol and summary (and an unknown protocol key from a newer minor)
    doc = document()
    del doc["summary"]
    doc["protocol"] = {"min_steps": 7, "from_the_future": 1}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    # WHEN read  THEN it still works, with defaults for what is missing
    baseline = bl.read(path)
    assert baseline.protocol.min_steps == 7 and baseline.unit == "samples/s"


@pytest.mark.parametrize("content, says", [
    (None, "no such baseline file; record one with: tune-advisor baseline"),
    ('{"schema_version": 1, "rounds": [', "not a readable baseline (corrupt JSON"),
    ("[1, 2]", "not a tune-advisor baseline (no schema_version)"),
    (json.dumps({"schema_version": 1, "probes": []}), "it looks like an analysis results.json"),
    (json.dumps({**document(), "schema_version": 99}), "written by a newer tune-advisor (baseline schema 99"),
    (json.dumps({**document(), "rounds": []}), "holds no successful round"),
    (json.dumps({**document(), "rounds": [{"id": "x"}]}), "a round is malformed"),
])
def test_unusable_baselines_are_usage_errors_naming_the_file_and_the_fix(tmp_path, content, says):
    # GIVEN a missing, corrupt, foreign, newer or empty baseline file
    path = tmp_path / "perf" / "baseline.json"
    if content is not None:
        path.parent.mkdir()
        path.write_text(content)
    # WHEN it is read  THEN a UsageError (exit 2) names the file and what is wrong
    with pytest.raises(UsageError) as info:
        bl.read(path)
    assert str(info.value).startswith(str(path)) and says in str(info.value)
    assert info.value.exit_code == 2


def test_failed_rounds_are_left_out_of_the_sample():
    sample = bl.sample_of([probe(1), probe(2, status=Status.OOM), probe(3)])
    assert len(sample.rounds) == 2


def test_the_same_machine_has_no_differences():
    assert bl.differences(GPU_ENV, json.loads(json.dumps(GPU_ENV))) == []


@pytest.mark.parametrize("fact, change", [
    ("GPU model", lambda e: e["gpu"].update(name="NVIDIA A100")),
    ("GPU driver", lambda e: e["gpu"].update(driver="535.10")),
    ("CUDA", lambda e: e["gpu"].update(cuda="12.1")),
    ("torch", lambda e: e.update(torch="2.4.0")),
    ("CPU model", lambda e: e.update(cpu_model="Xeon")),
    ("CPU cores", lambda e: e.update(cpu_count=4)),
])
def test_each_speed_relevant_fact_is_compared(fact, change):
    # GIVEN the baseline's machine and this one, differing in one fact
    current = json.loads(json.dumps(GPU_ENV))
    change(current)
    # WHEN compared  THEN exactly that fact is reported, old and new
    diffs = bl.differences(GPU_ENV, current)
    assert [d[0] for d in diffs] == [fact]


def test_other_hardware_is_refused_with_exit_code_3_and_a_way_out():
    # GIVEN a GPU baseline and a CPU runner
    error = bl.OtherHardware("perf/baseline.json", bl.differences(GPU_ENV, CPU_ENV))
    # THEN the refusal has its own exit code and says what differs and what to do
    assert error.exit_code == 3
    text = str(error)
    assert "GPU model: NVIDIA H100 (baseline) vs none (here)" in text
    assert "CPU cores: 16 (baseline) vs 2 (here)" in text
    assert "--allow-other-hardware" in text and "--against REF" in text
