"""The typed record of results.json: the committed schema is the one the classes generate, every committed document
matches both, nothing is lost reading one, old files still load, and the tool cannot write what its schema rejects."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tune_advisor import record, results
from tune_advisor.errors import UsageError
from tune_advisor.probe.result import ProbeResult, Status
from tune_advisor.render import markdown, view

from ..conftest import GOLDEN, ROOT

SCHEMA_FILE = ROOT / "docs" / "results-json.schema.json"
COMMITTED = sorted([*ROOT.glob("reports/*/results.json"), *ROOT.glob("reports/gpu/*/results.json"),
                    *GOLDEN.glob("*.json"), *GOLDEN.glob("gpu/*.json"), *GOLDEN.glob("rules/*.json")])


def name(path) -> str:
    return str(path.relative_to(ROOT))


def test_the_committed_schema_is_what_the_classes_generate():
    # a stale schema file fails here: regenerate it with `python -m tune_advisor.record --schema`
    assert SCHEMA_FILE.read_text(encoding="utf-8") == record.schema_text()
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))


def test_there_are_committed_documents_of_every_kind():
    # the list below must not silently shrink: CPU and GPU reports, goldens, and the rules' synthetic documents
    assert len(COMMITTED) >= 25
    assert {json.loads(p.read_text())["schema_version"] for p in COMMITTED} == {1, record.SCHEMA_VERSION}


@pytest.mark.parametrize("path", COMMITTED, ids=name)
def test_every_committed_document_matches_the_schema_and_the_classes_and_loses_nothing(path):
    document = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.validate(document, json.loads(SCHEMA_FILE.read_text(encoding="utf-8")),
                        cls=jsonschema.Draft202012Validator)
    typed = results.read_record(path)
    # every key the file holds comes back from the typed record, named in the classes or not
    assert typed.model_dump(mode="json", exclude_unset=True) == document


def test_a_version_1_file_loads_with_the_parts_version_2_added_absent():
    # GIVEN the cnn golden, written by the tool at schema_version 1 (before the statuses stopped/unsupported,
    # figures, plan.ablation and speedup.interval existed)
    path = GOLDEN / "cnn.results.json"
    assert json.loads(path.read_text())["schema_version"] == 1
    typed = results.read_record(path)
    # THEN it reads as a version 2 document without those parts
    assert typed.schema_version == 1 and typed.figures is None and typed.plan.ablation == []
    assert typed.speedup.interval is None and typed.speedup.median == pytest.approx(2.29, abs=0.005)
    # AND the reports take each side's figure from its probe's own window, as they always did for such files
    report = view.build(typed)
    assert report.figures["baseline"]["interval"] == "95% CI within one measured window (p001)"
    assert "2.29x" in markdown.render(typed)


def test_the_probe_statuses_are_the_probe_runners():
    schema = record.json_schema()["$defs"]["Probe"]["properties"]["status"]
    assert schema["enum"] == [status.value for status in Status]


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["probes"][0]["throughput"].update(median="fast"), r"probes\[0\]\.throughput\.median"),
    (lambda d: d["probes"][1]["step_time_s"].update(samples=[0.1, True]), r"probes\[1\]\.step_time_s\.samples\[1\]"),
    (lambda d: d["findings"].append({"code": "TA101", "gain": {"measured": "yes"}}), r"findings\[0\]\.gain\.measured"),
    (lambda d: d["environment"].update(cpu_count=4.0), r"environment\.cpu_count"),
    (lambda d: d["budget"].update(used_s=float("nan")), r"budget\.used_s"),
])
def test_the_reader_refuses_what_the_schema_rejects_saying_where(tmp_path, edit, where):
    document = json.loads((GOLDEN / "cnn.results.json").read_text())
    edit(document)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    with pytest.raises(UsageError, match=rf"not a usable results.json: {where}: .*; was it edited by hand\?"):
        results.read(path)


def test_the_reader_keeps_keys_it_does_not_name():
    # a later tool of the same schema_version may add keys (docs/results-json.md): read, kept, not refused
    document = json.loads((GOLDEN / "io_bound.results.json").read_text())
    document["probes"][0]["extra"]["new_collector"] = {"any": [1, "thing"]}
    document["added_later"] = True
    typed = record.parse(document)
    assert typed.probes[0].extra.new_collector == {"any": [1, "thing"]} and typed.added_later is True


def test_a_run_record_will_not_save_a_document_its_schema_rejects(tmp_path):
    # GIVEN a run whose probe entry is broken (a bug in the tool, not the user's doing)
    path = tmp_path / "results.json"
    run = results.RunRecord.start(path, command=["tune-advisor", "analyze", "x.py"], environment={"device": "cpu"},
                                  workload={"path": "x.py"}, limit_s=60.0, memory_budget_bytes=None,
                                  execution={"executor": "local", "distributed": None},
                                  identity={"workload_sha256": "h", "space": {}})
    run.add_probe(ProbeResult("p001", {"batch_size": 8}, Status.OK, raw={"step_s": [0.1], "items": [8.0]}).to_dict())
    run.save()
    run.document["probes"][0]["status"] = "fine"
    # THEN saving it raises, naming the place, and the file keeps what was saved before
    with pytest.raises(ValueError, match=r"would not match its schema: probes\[0\]\.status"):
        run.save()
    assert results.read(path)["probes"][0]["status"] == "ok"
