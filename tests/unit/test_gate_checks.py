"""Check strings -> check objects, and a clear UsageError for everything else."""

from __future__ import annotations

import pytest

from tune_advisor.errors import UsageError
from tune_advisor.gate.checks import BoundCheck, RelativeCheck, parse_check, parse_checks


@pytest.mark.parametrize("text, kind, metric, threshold, shown", [
    ("throughput:5%", RelativeCheck, "throughput", 0.05, "throughput:5%"),
    ("step_time:5%", RelativeCheck, "step_time", 0.05, "step_time:5%"),
    ("peak_memory:10%", RelativeCheck, "peak_memory", 0.10, "peak_memory:10%"),
    (" Peak-Memory : 12.5 % ", RelativeCheck, "peak_memory", 0.125, "peak_memory:12.5%"),
    ("throughput:>=1200", BoundCheck, "throughput", 1200.0, "throughput:>=1200"),
    ("throughput:>=1200 tokens/s", BoundCheck, "throughput", 1200.0, "throughput:>=1200 tokens/s"),
    ("step_time:<=50ms", BoundCheck, "step_time", 0.05, "step_time:<=50ms"),
    ("step_time:<=0.05s", BoundCheck, "step_time", 0.05, "step_time:<=0.05s"),
    ("step_time:<=0.05", BoundCheck, "step_time", 0.05, "step_time:<=0.05"),
    ("peak_memory:<=2GiB", BoundCheck, "peak_memory", 2 * 2**30, "peak_memory:<=2GiB"),
    ("peak_memory:<=512MB", BoundCheck, "peak_memory", 512 * 2**20, "peak_memory:<=512MB"),
    ("peak_memory:<=1000", BoundCheck, "peak_memory", 1000.0, "peak_memory:<=1000"),
])
def test_every_documented_form_parses(text, kind, metric, threshold, shown):
    # GIVEN a check string in one of the documented forms  WHEN it is parsed
    check = parse_check(text)
    # THEN it becomes the right kind of check, with the limit in base units and a normalised text
    assert type(check) is kind
    assert (check.metric, check.text) == (metric, shown)
    assert check.threshold == pytest.approx(threshold)


@pytest.mark.parametrize("text, says", [
    ("throughput", "unknown check"),
    ("thruput:5%", "did you mean 'throughput'"),
    ("latency:5%", "METRIC one of throughput, step_time, peak_memory"),
    ("throughput:five percent", "cannot read the limit"),
    ("throughput:0%", "above 0%"),
    ("throughput:100%", "below 100%"),
    ("throughput:<=1200", "throughput takes a floor: throughput:>=N"),
    ("step_time:>=1s", "step_time takes a ceiling"),
    ("peak_memory:>2GiB", "peak_memory takes a ceiling"),
    ("step_time:<=fast", "a step-time ceiling is a duration"),
    ("peak_memory:<=lots", "a memory ceiling is a size"),
    ("throughput:>=many", "a throughput floor is a number"),
    ("throughput:>=0", "above 0"),
    ("", "unknown check"),
])
def test_anything_else_is_a_usage_error_that_shows_the_valid_forms(text, says):
    # GIVEN a malformed check string  WHEN it is parsed
    with pytest.raises(UsageError) as info:
        parse_check(text)
    # THEN the message quotes it and says what is wrong (a UsageError exits 2)
    assert says in str(info.value)
    assert f"--check {text!r}" in str(info.value)
    assert info.value.exit_code == 2


def test_the_same_check_twice_is_kept_once_in_order():
    # GIVEN repeated checks written differently  WHEN parsed together
    checks = parse_checks(["peak_memory:10%", "throughput:5%", "Throughput: 5%"])
    # THEN each distinct check appears once, in the order given
    assert [c.text for c in checks] == ["peak_memory:10%", "throughput:5%"]
