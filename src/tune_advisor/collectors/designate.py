"""Which probes run the profiler: by default the baseline and the recommended configuration (SPEC §4).

The recommended configuration is known only when the search ends; its first re-measurement in the
confirmation (role `confirm:recommended`) is the first probe of it that can carry a profile. When the
baseline stays recommended, the baseline's own profile serves.
"""

from __future__ import annotations

from typing import Any, Iterable

PROFILED_ROLES = ("baseline", "confirm:recommended")


class ProfilePolicy:
    """`policy(role) -> bool`: True for the first probe of each designated role, False for every other."""

    def __init__(self, roles: Iterable[str] = PROFILED_ROLES, enabled: bool = True):
        self.roles, self.enabled = tuple(roles), enabled
        self._done: set[str] = set()

    def __call__(self, role: str) -> bool:
        if not self.enabled or role not in self.roles or role in self._done:
            return False
        self._done.add(role)
        return True


def profiled_probe(probes: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any] | None:
    """The first probe (results.json PROBE objects) with these settings that has `extra.profile`, or None."""
    for probe in probes:
        if probe.get("settings") == settings and (probe.get("extra") or {}).get("profile"):
            return probe
    return None
