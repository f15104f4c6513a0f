"""results.json: the stable, versioned record of a run (SPEC §7), written atomically after every probe."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from . import __version__
from .errors import UsageError

SCHEMA_VERSION = 1


def header(command: list[str], environment: dict, workload: dict) -> dict[str, Any]:
    """What every file the tool saves starts with: schema, tool, time, command, machine, workload."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "tune-advisor", "version": __version__},
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": list(command),
        "environment": environment,
        "workload": workload,
    }


def new_document(command: list[str], environment: dict, workload: dict) -> dict[str, Any]:
    return {
        **header(command, environment, workload),
        "baseline": None,
        "recommended": None,
        "speedup": None,
        "probes": [],
        "findings": [],
        "budget": {"limit_s": None, "used_s": 0.0, "probes_run": 0, "unexplored": []},
    }


def write_atomic(path: Path, document: dict[str, Any]) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over: a kill never leaves half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, indent=1, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not a readable results.json ({exc})") from None
    version = document.get("schema_version") if isinstance(document, dict) else None
    if not isinstance(version, int):
        raise UsageError(f"{path}: not a tune-advisor results.json (no schema_version)")
    if version > SCHEMA_VERSION:
        raise UsageError(f"{path}: written by a newer tune-advisor (schema {version}; this one reads up to "
                         f"{SCHEMA_VERSION}); upgrade tune-advisor")
    return document
