"""The probe child's entry: what it imports before its clock starts, and how it writes the result file."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from tune_advisor import child
from tune_advisor.knobs import full_settings
from tune_advisor.probe.outcome import write_result
from tune_advisor.probe.spec import ProbeSpec


def test_the_entry_module_imports_no_torch():
    # outcome.measure's clock starts before torch loads (child_wall_s counts its import outside the zygote)
    code = "import sys, tune_advisor.child; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_the_result_is_written_whole_with_non_finite_figures_as_null(tmp_path):
    path = tmp_path / "result.json"
    write_result(path, {"extra": {"noise": math.inf, "steps": (1.0, math.nan)}, "status": "ok"})
    assert json.loads(path.read_text()) == {"extra": {"noise": None, "steps": [1.0, None]}, "status": "ok"}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_the_childs_files_stay_where_the_parent_named_them_when_a_script_changes_folder(tmp_path, monkeypatch):
    # GIVEN a probe whose files the parent named relative to its folder (analyze -o reports/x), and a script that
    # trains in a folder of its own (script mode's mirror of the caller's folder)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "probes").mkdir()
    (tmp_path / "elsewhere").mkdir()
    spec = ProbeSpec(id="p001", workload="train.py", settings=full_settings())
    (tmp_path / "probes" / "p001.spec.json").write_text(spec.to_json())

    def script_in_its_folder(spec, phase, workdir=None):
        os.chdir(tmp_path / "elsewhere")
        phase("script: measuring")
        return {"status": "ok", "workdir": str(workdir)}

    monkeypatch.setattr(child, "train_and_measure", script_in_its_folder)
    assert child.main(["probes/p001.spec.json", "probes/p001.result.json"]) == 0
    # THEN the phase note and the result are where the parent looks, and nothing landed in the script's folder
    probes = tmp_path / "probes"
    assert (probes / "p001.result.json.phase").read_text() == "script: measuring"
    assert json.loads((probes / "p001.result.json").read_text())["workdir"] == str(probes)
    assert list((tmp_path / "elsewhere").iterdir()) == []
