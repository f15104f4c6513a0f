"""The pytest plugin loads through its entry point, registers its marker, and costs a suite nothing without it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tune_advisor.pytest_plugin import checks_from


def run_pytest(folder, *args):
    (folder / "pytest.ini").write_text("[pytest]\n")  # its own rootdir: the project's settings stay out
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=folder,
                          capture_output=True, text=True, timeout=120)


def test_a_suite_without_the_marker_does_not_import_torch_or_numpy(tmp_path):
    # GIVEN an ordinary test suite in an environment where tune-advisor is installed
    (tmp_path / "test_plain.py").write_text(
        "import sys\n\ndef test_nothing_heavy_was_imported():\n"
        "    assert 'tune_advisor.pytest_plugin' in sys.modules  # the plugin is active...\n"
        "    assert 'torch' not in sys.modules and 'numpy' not in sys.modules  # ...and cheap\n")
    # WHEN pytest runs it
    result = run_pytest(tmp_path, "-q")
    # THEN the plugin was loaded through its entry point, and torch and numpy were not
    assert result.returncode == 0, result.stdout + result.stderr
    # AND the marker is registered (no PytestUnknownMarkWarning for users)
    markers = run_pytest(tmp_path, "--markers")
    assert "@pytest.mark.perf_budget(workload" in markers.stdout


@pytest.mark.parametrize("kwargs, checks", [
    ({"min_throughput": 1200}, ["throughput:>=1200"]),
    ({"max_regression": "5%"}, ["throughput:5%"]),
    ({"max_regression": 0.05, "max_memory_growth": 0.1}, ["throughput:5%", "peak_memory:10%"]),
    ({"max_step_time": 0.05, "checks": "step_time:3%"}, ["step_time:3%", "step_time:<=0.05s"]),
    ({"max_step_time": "50ms", "checks": ["peak_memory:<=2GiB"]}, ["peak_memory:<=2GiB", "step_time:<=50ms"]),
])
def test_marker_arguments_become_gate_checks(kwargs, checks):
    assert checks_from(kwargs) == checks
