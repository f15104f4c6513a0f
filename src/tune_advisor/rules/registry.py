"""The rule registry: each rule is a function registered with its stable code, its name and its severity.

A rule's docstring is its documentation. It starts with a one-line summary, then has the sections in SECTIONS,
each a line `Name:` followed by indented Markdown; `tune_advisor.rules.docs` turns it into docs/rules/<CODE>.md.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Callable

SEVERITIES = ("error", "warning", "info")  # in the order findings of equal gain are listed
FAMILIES = {
    "TA1": "input pipeline",
    "TA2": "host and launch overhead",
    "TA3": "memory",
    "TA4": "precision and tensor cores",
    "TA5": "graph, compile and cuDNN",
    "TA6": "distributed",
    "TA7": "numerics and safety",
    "TA8": "environment",
}
SECTIONS = ("What it finds", "Why it matters", "How it is measured", "Fix", "Example")


@dataclass(frozen=True)
class Rule:
    code: str  # TA101: never reused, never renumbered
    name: str  # kebab-case, named after the problem (ruff style), not after the fix
    severity: str
    check: Callable  # check(ctx: Context) -> Finding | None

    @property
    def family(self) -> str:
        return FAMILIES[self.code[:3]]

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.check) or ""

    @property
    def summary(self) -> str:
        return self.doc.split("\n", 1)[0]

    def sections(self) -> dict[str, str]:
        """The docstring's sections, name -> dedented Markdown body."""
        return parse_sections(self.doc)


RULES: dict[str, Rule] = {}


def rule(code: str, name: str, severity: str):
    """Register the decorated check function as rule `code`. Checks the docstring has every section."""

    def register(check: Callable) -> Callable:
        if not re.fullmatch(r"TA\d{3}", code) or code[:3] not in FAMILIES:
            raise ValueError(f"rule code {code!r}: expected TA followed by 3 digits of a known family")
        if code in RULES:
            raise ValueError(f"rule code {code} is registered twice ({RULES[code].name} and {name})")
        if severity not in SEVERITIES:
            raise ValueError(f"rule {code}: severity {severity!r} is not one of {SEVERITIES}")
        registered = Rule(code, name, severity, check)
        missing = [s for s in SECTIONS if not registered.sections().get(s)]
        if missing:
            raise ValueError(f"rule {code} ({name}): the docstring lacks the section(s) {', '.join(missing)}")
        RULES[code] = registered
        return check

    return register


def parse_sections(doc: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in doc.splitlines():
        header = line.rstrip()
        if header.endswith(":") and header[:-1] in SECTIONS:
            current = header[:-1]
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {name: inspect.cleandoc("\n".join(lines)) for name, lines in sections.items()}
