import pytest

from tune_advisor.api import parse_bytes, parse_duration
from tune_advisor.cli._common import parse_sets
from tune_advisor.errors import UsageError


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("5m", 300), ("1h", 3600), ("1m30s", 90), ("45", 45),
                                           ("0.5s", 0.5)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 minutes", "m"])
def test_parse_duration_rejects_nonsense(text):
    with pytest.raises(UsageError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("text, size", [("8GiB", 8 * 2**30), ("512MB", 512 * 2**20), ("2g", 2 * 2**30), ("100", 100)])
def test_parse_bytes(text, size):
    assert parse_bytes(text) == size


def test_parse_sets():
    assert parse_sets(["batch_size=64", " amp = bf16 "]) == {"batch_size": "64", "amp": "bf16"}
    with pytest.raises(UsageError, match="expected KNOB=VALUE"):
        parse_sets(["batch_size"])
