"""Defaults from `[tool.tune-advisor]` in the nearest pyproject.toml (flags on the command line win)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# Options that may come from pyproject, and the commands that take them.
CONFIGURABLE = {
    "device": ("analyze", "probe"), "budget": ("analyze",), "probe_timeout": ("analyze", "probe"),
    "max_memory": ("analyze",), "memory_margin": ("analyze",), "min_time": ("analyze", "probe"),
    "min_steps": ("analyze", "probe"),
    "warmup": ("analyze", "probe"), "seed": ("analyze",), "out": ("analyze",), "strategy": ("analyze",),
    "select": ("analyze", "rules", "report"), "ignore": ("analyze", "rules", "report"),
    # The CI gate: its checks, its baseline file, and rounds for both sides of the comparison.
    "check": ("gate",), "baseline": ("gate",), "rounds": ("gate", "baseline"),
    # Script mode: [tool.tune-advisor.map], knob -> "FLAG[:VALUE]" (the --map option), and the script's folder.
    "map": ("analyze",), "script_cwd": ("analyze",),
    # How far the machine's level moves between runs, carried by every figure (figures.SESSION_DRIFT's default).
    "session_drift": ("analyze",),
    # The training run's length: compile is recommended only where its compile time pays off within it.
    "train_steps": ("analyze",),
    # What an hour of the machine costs: the reports show an epoch's cost before and after.
    "cost_per_hour": ("analyze", "report"),
}
PARAMETER = {"map": "flag_map"}  # where the option's parameter has another name than its key


def find_pyproject(start: Path) -> Path | None:
    for folder in [start, *start.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def default_map(start: Path | None = None) -> dict[str, dict[str, Any]]:
    """click's default_map for each command, from [tool.tune-advisor]; {} when there is none."""
    path = find_pyproject(start or Path.cwd())
    if path is None:
        return {}
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8")).get("tool", {}).get("tune-advisor", {})
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it as TOML ({exc})") from None
    commands: dict[str, dict[str, Any]] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in CONFIGURABLE:
            valid = ", ".join(k.replace("_", "-") for k in CONFIGURABLE)
            raise UsageError(f"{path}: [tool.tune-advisor] has an unknown key '{key}'; valid keys: {valid}")
        if name == "map":
            if not isinstance(value, dict):
                raise UsageError(f"{path}: [tool.tune-advisor] map must be a table of knob = \"FLAG[:VALUE]\", "
                                 "e.g. [tool.tune-advisor.map] batch_size = \"--batch-size\"")
            value = [f"{k}={v}" for k, v in value.items()]  # the --map option's form
        for command in CONFIGURABLE[name]:
            commands.setdefault(command, {})[PARAMETER.get(name, name)] = value
    return commands
