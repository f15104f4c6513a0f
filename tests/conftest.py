"""Shared helpers: paths, a fast measurement protocol for real child probes, and a CLI runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tune_advisor.probe.spec import Protocol

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
BAD = FIXTURES / "bad"
WORKLOADS = Path(__file__).resolve().parent / "workloads"

# Real child processes, measured briefly: these tests check behaviour, not speed.
FAST = Protocol(warmup_steps=1, min_steps=3, min_time_s=0.1, max_steps=30, max_time_s=2.0)


@pytest.fixture
def cli():
    from tune_advisor.cli import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    return invoke
