"""Where probes run. By default one after another, each in a child process of this machine (probe/runner.py);
`--executor ray` runs them as Ray tasks on a Ray cluster or a local Ray instance (executors/ray.py)."""

from __future__ import annotations

from ..errors import UsageError

EXECUTORS = ("local", "ray")


def create(name: str, address: str | None, device: str):
    """The executor for `--executor NAME` (None: run probes here, one at a time). Raises UsageError."""
    if name not in EXECUTORS:
        raise UsageError(f"--executor {name}: expected one of {', '.join(EXECUTORS)}")
    if name == "local":
        if address:
            raise UsageError("--ray-address needs --executor ray")
        return None
    from .ray import RayExecutor

    return RayExecutor(address, device)
