"""docs/ci-gating.md stays true: its workflow is valid YAML whose gate command the CLI accepts."""

from __future__ import annotations

import re
import shlex

import typer
import yaml

from tune_advisor.cli import app
from tune_advisor.pytest_plugin import ARGUMENTS

from ..conftest import ROOT

DOC = (ROOT / "docs" / "ci-gating.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, re.S)


def test_the_github_actions_example_is_a_workflow_whose_gate_command_parses():
    # GIVEN the workflow in the docs
    (text,) = blocks("yaml")
    workflow = yaml.safe_load(text)
    steps = workflow["jobs"]["perf-gate"]["steps"]
    uses = [s.get("uses", "").split("@")[0] for s in steps]
    # THEN it checks out with full history, sets up Python, and keeps the outputs even when the gate fails
    assert uses[:2] == ["actions/checkout", "actions/setup-python"] and "actions/upload-artifact" in uses
    assert steps[0]["with"]["fetch-depth"] == 0
    upload = steps[uses.index("actions/upload-artifact")]
    assert upload["if"] == "always()"
    # AND the gate command is one the CLI accepts, with the outputs where the upload looks for them
    (gate,) = [s["run"] for s in steps if "tune-advisor gate" in s.get("run", "")]
    argv = shlex.split(gate.replace("${{ github.base_ref }}", "main"))
    assert argv[:2] == ["tune-advisor", "gate"]
    command = typer.main.get_command(app).commands["gate"]
    params = command.make_context("gate", argv[2:]).params
    assert params["against"] == "origin/main" and list(params["check"]) == ["throughput:5%", "peak_memory:10%"]
    assert str(params["junit"]).startswith(upload["with"]["path"].rstrip("/"))


def test_the_documented_marker_arguments_are_the_plugins():
    # GIVEN the arguments the docs list for @pytest.mark.perf_budget
    section = DOC.split("## pytest plugin")[1].split("## Configuration")[0]
    listed = set(re.findall(r"`(\w+)`", section.split("Arguments:")[1]))
    # THEN each is one the plugin accepts, and none it accepts is undocumented
    assert listed - {"Protocol"} == set(ARGUMENTS)


def test_the_documented_pyproject_table_configures_the_gate(tmp_path):
    # GIVEN the [tool.tune-advisor] example of the docs in a project's pyproject.toml
    from tune_advisor.cli import config

    (text,) = blocks("toml")
    (tmp_path / "pyproject.toml").write_text(text)
    # WHEN the CLI reads its defaults there
    defaults = config.default_map(tmp_path)
    # THEN gate gets its checks, baseline and rounds, and baseline its rounds
    assert defaults["gate"] == {"baseline": "perf/baseline.json", "check": ["throughput:5%", "peak_memory:10%"],
                                "rounds": 3}
    assert defaults["baseline"] == {"rounds": 3}
