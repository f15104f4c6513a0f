"""pytest plugin: `@pytest.mark.perf_budget(...)` gives a test the CI gate's verdict.

    @pytest.mark.perf_budget(workload="train.py", baseline="perf/baseline.json", max_regression="5%",
                             min_throughput=1200, settings={"batch_size": 64})
    def test_training_speed():
        pass

The gate runs before the test body; the test fails with the gate's message on a regression (or when a check cannot
be evaluated), and is skipped when the baseline comes from other hardware (unless allow_other_hardware=True).
Relative paths are taken from pytest's rootdir. This module imports only pytest at start-up: suites that never use
the marker do not pay for torch.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

MARKER = "perf_budget"
ARGUMENTS = ("workload", "baseline", "against", "min_throughput", "max_regression", "max_memory_growth",
             "max_step_time", "checks", "settings", "rounds", "max_rounds", "device", "allow_other_hardware",
             "protocol", "probe_timeout")


class PerfBudgetWarning(UserWarning):
    """A gate warning (noise too high to see the allowed change, other hardware allowed, ...)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(workload, baseline=None, against=None, min_throughput=None, max_regression=None, "
        "max_memory_growth=None, max_step_time=None, checks=(), settings=None, rounds=3, max_rounds=7, "
        "device='auto', "
        "allow_other_hardware=False): run the tune-advisor CI gate on a workload file; the test fails on a "
        "performance regression",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    marker = item.get_closest_marker(MARKER)
    if marker is not None:
        _gate(item, marker)


def checks_from(kwargs: dict[str, Any]) -> list[str]:
    """The marker's keyword arguments as gate check strings."""
    checks = [str(c) for c in _as_list(kwargs.get("checks"))]
    if kwargs.get("min_throughput") is not None:
        checks.append(f"throughput:>={kwargs['min_throughput']}")
    if kwargs.get("max_regression") is not None:
        checks.append(f"throughput:{_percent(kwargs['max_regression'])}")
    if kwargs.get("max_memory_growth") is not None:
        checks.append(f"peak_memory:{_percent(kwargs['max_memory_growth'])}")
    if kwargs.get("max_step_time") is not None:
        value = kwargs["max_step_time"]
        checks.append(f"step_time:<={value}" + ("s" if isinstance(value, (int, float)) else ""))
    return checks


def _gate(item: pytest.Item, marker: pytest.Mark) -> None:
    kwargs = dict(marker.kwargs)
    if marker.args:
        kwargs.setdefault("workload", marker.args[0])
    unknown = sorted(set(kwargs) - set(ARGUMENTS))
    if unknown:
        pytest.fail(f"{MARKER}: unknown argument(s) {', '.join(unknown)}; valid: {', '.join(ARGUMENTS)}",
                    pytrace=False)
    if not kwargs.get("workload"):
        pytest.fail(f"{MARKER}: give the workload file, e.g. @pytest.mark.{MARKER}(workload='train.py', ...)",
                    pytrace=False)

    # Imported here, not at start-up: the gate pulls in numpy and (in its child processes) torch.
    from tune_advisor.errors import TuneAdvisorError
    from tune_advisor.gate import DEFAULT_ROUNDS, run_gate
    from tune_advisor.probe.spec import Protocol

    root = Path(item.config.rootpath)

    def resolve(path: str | None) -> Path | None:  # relative to the test suite's root, like pytest's own paths
        return None if path is None else Path(path) if Path(path).is_absolute() else root / path

    settings = kwargs.get("settings")
    if isinstance(settings, dict):
        settings = [f"{k}={v}" for k, v in settings.items()]
    protocol = kwargs.get("protocol")
    try:
        checks = checks_from(kwargs)
        result = run_gate(
            resolve(kwargs["workload"]), baseline=resolve(kwargs.get("baseline")), against=kwargs.get("against"),
            checks=checks or None, settings=_as_list(settings), rounds=kwargs.get("rounds", DEFAULT_ROUNDS),
            max_rounds=kwargs.get("max_rounds"), device=kwargs.get("device", "auto"),
            protocol=Protocol(**protocol) if isinstance(protocol, dict) else protocol,
            probe_timeout=kwargs.get("probe_timeout", 120.0),
            allow_other_hardware=bool(kwargs.get("allow_other_hardware", False)), command=["pytest", item.nodeid])
    except TuneAdvisorError as exc:
        pytest.fail(f"{MARKER}: {exc}", pytrace=False)
    except TypeError as exc:  # a protocol dict with unknown keys
        pytest.fail(f"{MARKER}: {exc}", pytrace=False)
    item.user_properties.append((MARKER, json.dumps({"verdict": result.verdict, "checks": result.document["checks"]})))
    for warning in result.warnings:
        warnings.warn(PerfBudgetWarning(warning), stacklevel=1)
    if result.verdict == "refused":
        pytest.skip(f"{MARKER}: {result.message()}")
    if result.exit_code:
        pytest.fail(f"{MARKER}: {result.message()}", pytrace=False)


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _percent(value: Any) -> str:
    """'5%' stays; 0.05 (a fraction) becomes '5%'."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value * 100:g}%"
    return str(value)
