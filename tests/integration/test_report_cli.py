"""`tune-advisor report` and `tune-advisor compare`: saved results in, reports out, clear errors, no torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from ..conftest import ROOT

GOLDEN = ROOT / "tests" / "golden"
CNN, IO = GOLDEN / "cnn.results.json", GOLDEN / "io_bound.results.json"


def bad_files(tmp_path):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"schema_version": 1, "probes": [')
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**json.loads(CNN.read_text()), "schema_version": 99}))
    return {"missing": (tmp_path / "missing.json", "no such file"),
            "corrupt": (corrupt, "not a readable results.json"),
            "newer": (newer, "written by a newer tune-advisor")}


def test_report_re_renders_all_three_outputs(cli, tmp_path):
    result = cli("report", CNN, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "report.html").stat().st_size > 10_000
    assert "2.29x" in (tmp_path / "out" / "report.md").read_text()
    assert "2.29x faster (95% CI 2.21–2.38)." in result.output and "wrote" in result.output


def test_report_verbose_prints_every_derivation_and_a_cost_per_hour_prices_an_epoch(cli, tmp_path):
    # GIVEN the io_bound run (2,048 samples an epoch) re-rendered with an hour's price
    result = cli("report", IO, "-o", tmp_path, "--cost-per-hour", "2.50")
    assert result.exit_code == 0, result.output
    # THEN the summary and both reports give the epoch's time and cost before and after
    assert "cost of an epoch at 2.5/h: " in result.output and "one epoch (2,048 samples): " in result.output
    for name in ("report.html", "report.md"):
        assert "cost of an epoch at 2.5/h" in (tmp_path / name).read_text()
    assert "Speedup " not in result.output  # the derivation waits for --verbose
    verbose = cli("report", IO, "-o", tmp_path, "--verbose")
    assert "Speedup " in verbose.output and "Every probe" in verbose.output
    assert cli("report", IO, "-o", tmp_path, "--cost-per-hour", "0").exit_code != 0


def test_report_writes_next_to_the_results_by_default(cli, tmp_path):
    copy = tmp_path / "run" / "results.json"
    copy.parent.mkdir()
    shutil.copy(IO, copy)
    result = cli("report", copy, "--quiet")
    assert result.exit_code == 0, result.output
    assert result.output == ""
    assert {p.name for p in copy.parent.iterdir()} == {"results.json", "report.html", "report.md"}


@pytest.mark.parametrize("kind", ["missing", "corrupt", "newer"])
def test_report_and_compare_reject_unusable_files_with_one_line(cli, tmp_path, kind):
    path, message = bad_files(tmp_path)[kind]
    for args in (["report", path, "-o", tmp_path / "o"], ["compare", CNN, path, "-o", tmp_path / "o"]):
        result = cli(*args)
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_report_into_an_unwritable_place_is_a_usage_error(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = cli("report", CNN, "-o", blocker / "sub")
    assert result.exit_code == 2 and "cannot write the reports" in result.output


def test_compare_shows_two_runs_side_by_side(cli, tmp_path):
    result = cli("compare", CNN, IO, "-o", tmp_path)
    assert result.exit_code == 0, result.output
    page = (tmp_path / "compare.html").read_text()
    assert "cnn.results.json" in page and "io_bound.results.json" in page
    assert "2.29x" in result.output and "6.84x" in result.output
    assert "num_workers: 0 → 8" in result.output  # the recommended settings that differ


def test_report_never_imports_torch(tmp_path):
    # WHEN the report command runs in a fresh interpreter THEN torch is never imported (no torch work, no GPU)
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['tune-advisor', 'report', {str(CNN)!r}, '-o', {str(tmp_path)!r}, '--quiet']\n"
        "try:\n    runpy.run_module('tune_advisor', run_name='__main__')\n"
        "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print('TORCH:', loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "TORCH: []" in done.stdout, done.stdout
    assert (tmp_path / "report.html").exists()
