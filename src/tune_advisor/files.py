"""Atomic file writes: a reader, or a run killed mid-write, sees the old file or the new one, never half of one.

Every file the tool writes whole (results.json, reports, the FLOP-roof cache, profiler traces) goes through here.
A leaf module: it imports nothing from the package, so anything may use it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: Path, data: bytes, mode: int = 0o644) -> Path:
    """Write `data` to a temporary file in the same folder, fsync, then rename it over `path`; return `path`.

    The temporary file is named `<name>…tmp` (rundir sweeps those a killed run left). On any failure it is removed,
    the previous file is kept, and the error (OSError for a full disk or a read-only folder) propagates.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the rename must not land before the data: a crash would leave an empty file
        os.chmod(tmp, mode)  # mkstemp makes the file owner-only whatever the caller asked for
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> Path:
    """`write_bytes_atomic` of `text` in UTF-8."""
    return write_bytes_atomic(path, text.encode("utf-8"), mode)


def write_json_atomic(path: Path, document: Any, mode: int = 0o644) -> Path:
    """`document` as strict JSON (indent 1; NaN or infinity raise ValueError before anything is written)."""
    return write_text_atomic(path, json.dumps(document, indent=1, allow_nan=False), mode)
