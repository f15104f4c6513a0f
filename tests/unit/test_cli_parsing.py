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


def test_pyproject_defaults_map_to_each_command(tmp_path):
    from tune_advisor.cli.config import default_map

    (tmp_path / "pyproject.toml").write_text('[tool.tune-advisor]\nbudget = "5m"\nprobe-timeout = "60s"\n')
    nested = tmp_path / "src" / "pkg"
    nested.mkdir(parents=True)
    assert default_map(nested) == {"analyze": {"budget": "5m", "probe_timeout": "60s"},
                                   "probe": {"probe_timeout": "60s"}}


def _project(tmp_path, monkeypatch, table: str):
    """A project whose pyproject's [tool.tune-advisor] holds `table`, with a minimal workload, as the working
    folder; returns the CLI invoked there."""
    from typer.testing import CliRunner

    from tune_advisor.cli import app

    (tmp_path / "pyproject.toml").write_text(f"[tool.tune-advisor]\n{table}\n")
    (tmp_path / "model.py").write_text("def build_model(): ...\ndef build_dataset(): ...\n")
    monkeypatch.chdir(tmp_path)
    return lambda *args: CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("key, value, flag, says", [
    ("session_drift", 1.5, "-1", "-1.0: expected"),  # how far the machine's level moves between runs
    ("train_steps", 0, "-3", "-3: expected how many training steps"),  # the training run's length
])
def test_an_analyze_option_from_pyproject_is_checked_as_from_its_flag(tmp_path, monkeypatch, key, value, flag, says):
    from tune_advisor.cli.config import default_map

    option = "--" + key.replace("_", "-")
    cli = _project(tmp_path, monkeypatch, f"{key.replace('_', '-')} = {value}")
    assert default_map(tmp_path) == {"analyze": {key: value}}
    # a value no run can have is refused before any probe runs, from the file as from the flag
    result = cli("analyze", "model.py")
    assert result.exit_code == 2 and f"{option} {value}: expected" in result.output
    result = cli("analyze", "model.py", option, flag)
    assert result.exit_code == 2 and f"{option} {says}" in result.output


def test_pyproject_with_an_unknown_key_is_a_usage_error(tmp_path):
    from tune_advisor.cli.config import default_map

    (tmp_path / "pyproject.toml").write_text('[tool.tune-advisor]\nbudgett = "5m"\n')
    with pytest.raises(UsageError, match="unknown key 'budgett'"):
        default_map(tmp_path)


def test_pyproject_defaults_apply_and_flags_win(tmp_path, monkeypatch):
    # GIVEN a project whose pyproject asks for a device this tool does not know
    cli = _project(tmp_path, monkeypatch, 'device = "tpu"')
    # WHEN no --device is given, the pyproject value is used
    result = cli("probe", "model.py")
    assert result.exit_code == 2 and "--device tpu: expected auto, cpu, cuda" in result.output
    # WHEN --device is given, it wins
    result = cli("probe", "model.py", "--device", "xpu")
    assert result.exit_code == 2 and "--device xpu:" in result.output
