"""The probe child's entry: what it imports before its clock starts, and how it writes the result file."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from tune_advisor.probe.outcome import write_result


def test_the_entry_module_imports_no_torch():
    # outcome.measure's clock starts before torch loads (child_wall_s counts its import outside the zygote)
    code = "import sys, tune_advisor.child; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_the_result_is_written_whole_with_non_finite_figures_as_null(tmp_path):
    path = tmp_path / "result.json"
    write_result(path, {"extra": {"noise": math.inf, "steps": (1.0, math.nan)}, "status": "ok"})
    assert json.loads(path.read_text()) == {"extra": {"noise": None, "steps": [1.0, None]}, "status": "ok"}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
