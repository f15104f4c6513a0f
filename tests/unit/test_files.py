"""The one atomic writer and the one number formatter, as each of their users calls them."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tune_advisor import files, fmt, results
from tune_advisor.errors import UsageError


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_writes_replace_the_file_whole_with_the_mode_asked_for(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("old")
    assert files.write_text_atomic(path, "new ✓") == path
    assert path.read_text(encoding="utf-8") == "new ✓" and mode(path) == 0o644  # a report is meant to be shared
    files.write_bytes_atomic(path, b"\x1f\x8b", mode=0o600)
    assert path.read_bytes() == b"\x1f\x8b" and mode(path) == 0o600
    files.write_json_atomic(path, {"a": [1.5]})
    assert json.loads(path.read_text()) == {"a": [1.5]}
    results.write_atomic(path, {"a": 1})
    assert mode(path) == 0o600  # results.json stays owner-only, as mkstemp always made it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # no temporary file left


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary_one(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("previous")
    with pytest.raises(ValueError):
        files.write_json_atomic(path, {"x": float("nan")})  # strict JSON
    with pytest.raises(TypeError):
        files.write_bytes_atomic(path, "not bytes")  # fails mid-write, after the temporary file exists
    with pytest.raises(FileNotFoundError):
        files.write_text_atomic(tmp_path / "gone" / "report.md", "x")
    with pytest.raises(UsageError, match="cannot write"):
        results.write_atomic(tmp_path / "gone" / "results.json", {})
    assert path.read_text() == "previous" and sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


@pytest.mark.parametrize("value, report, finding", [
    (40.0, "40.0 samples/s", "40 samples/s"),
    (99.96, "100.0 samples/s", "100 samples/s"),
    (5.123, "5.12 samples/s", "5.12 samples/s"),
    (1393.2, "1,393 samples/s", "1,393 samples/s"),
    (None, "-", "-"),
])
def test_rates_in_reports_keep_a_decimal_from_10_and_findings_use_significant_digits(value, report, finding):
    assert fmt.fmt_rate(value, "samples/s") == report
    assert fmt.fmt_rate(value, "samples/s", significant_below=100) == finding


def test_sizes_in_reports_have_two_decimals_and_findings_one():
    assert fmt.fmt_bytes(539734016) == "514.73 MiB" and fmt.fmt_bytes(539734016, digits=1) == "514.7 MiB"
    assert fmt.fmt_bytes(512) == "512 B" and fmt.fmt_bytes(0) == fmt.fmt_bytes(None) == "-"


def test_a_throughput_without_an_interval_is_shown_without_brackets():
    # a window too short for its loader's waves to resample has no interval (analysis.stats.resamples)
    shown = {"median": 5505.2, "ci_low": 5400.0, "ci_high": 5600.0, "unit": "samples/s"}
    assert fmt.fmt_ci(shown) == "5,505 [5,400, 5,600] samples/s"
    assert fmt.fmt_ci({**shown, "ci_low": float("nan"), "ci_high": float("nan")}) == "5,505 samples/s"
    assert fmt.fmt_ci({**shown, "ci_low": None}) == "5,505 samples/s"
