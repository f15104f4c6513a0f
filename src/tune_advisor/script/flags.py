"""Flag mapping for script mode: `--map KNOB=FLAG[:VALUE[=ARG],...]` lets the advisor set a knob through the script's
own command-line flag, and shows the recommendation as the command line to run. Pure Python (no torch).

    batch_size=--batch-size          the knob's value is the flag's argument: --batch-size 128
    channels_last=--channels-last    a bool knob: the bare flag when true, nothing when false (argparse store_true)
    amp=--precision:bf16             only these values go through the flag: --precision bf16
    amp=--precision:bf16=bf16-mixed  ... with the script's own spelling of the value: --precision bf16-mixed

A knob at the script's own (baseline) value adds no flag: the script's default or the user's arguments stand.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .. import knobs
from ..errors import UsageError

MAP_HELP = "KNOB=FLAG, KNOB=FLAG:VALUE or KNOB=FLAG:VALUE=ARG (e.g. batch_size=--batch-size, amp=--precision:bf16)"


@dataclass(frozen=True)
class FlagMap:
    """One knob set through one flag; `values`: knob value -> the flag's argument, or empty for every value."""

    knob: str
    flag: str
    values: dict[Any, str] = field(default_factory=dict)

    def argv(self, value: Any) -> list[str]:
        """The arguments that set the knob to `value` ([] when the flag cannot express it)."""
        if self.values:
            return [self.flag, self.values[value]] if value in self.values else []
        if knobs.KNOBS[self.knob].type is bool:
            return [self.flag] if value else []
        return [self.flag, str(value)]

    def to_dict(self) -> dict[str, Any]:
        """results.json's form: {"flag": "--precision", "values": {"bf16": "bf16"}} (values {} for every value)."""
        return {"flag": self.flag, "values": {_text(k): v for k, v in self.values.items()}}

    @classmethod
    def from_dict(cls, knob: str, d: Mapping[str, Any]) -> "FlagMap":
        kind = knobs.KNOBS[knob]
        return cls(knob, str(d["flag"]), {kind.parse(k): str(v) for k, v in dict(d.get("values") or {}).items()})


def parse_map(text: str) -> FlagMap:
    """`KNOB=FLAG[:VALUE[=ARG],...]` -> FlagMap; UsageError naming what is wrong."""
    knob, sep, rest = str(text).partition("=")
    knob = knob.strip()
    where = f"--map {text!r}"
    if not sep or not knob or not rest.strip():
        raise UsageError(f"{where}: expected {MAP_HELP}")
    if knob not in knobs.KNOBS:
        raise UsageError(f"{where}: {knobs.unknown_knob_message(knob)}")
    flag, colon, spec = rest.strip().partition(":")
    if not flag.startswith("-") or any(c.isspace() for c in flag) or len(flag.strip("-")) == 0:
        raise UsageError(f"{where}: '{flag}' is not a flag; a flag starts with '-' (e.g. --batch-size)")
    values: dict[Any, str] = {}
    if colon:
        items = [item.strip() for item in spec.split(",")]
        if not all(items):
            raise UsageError(f"{where}: nothing after ':'; expected {MAP_HELP}")
        for item in items:
            value, eq, arg = item.partition("=")
            try:
                parsed = knobs.KNOBS[knob].parse(value.strip())
            except ValueError as exc:
                raise UsageError(f"{where}: {exc}") from None
            values[parsed] = arg.strip() if eq else value.strip()
    return FlagMap(knob, flag, values)


def parse_maps(specs: Iterable[str] | Mapping[str, str] | None) -> dict[str, FlagMap]:
    """Every --map (or pyproject's [tool.tune-advisor.map] table, knob -> FLAG[:VALUE]) by knob; one map per knob."""
    if not specs:
        return {}
    items = [f"{k}={v}" for k, v in specs.items()] if isinstance(specs, Mapping) else list(specs)
    maps: dict[str, FlagMap] = {}
    for text in items:
        parsed = parse_map(text)
        if parsed.knob in maps:
            raise UsageError(f"--map {text!r}: {parsed.knob} is mapped twice; give one map per knob")
        maps[parsed.knob] = parsed
    return maps


def maps_to_json(maps: Mapping[str, FlagMap]) -> dict[str, dict[str, Any]]:
    return {knob: m.to_dict() for knob, m in maps.items()}


def maps_from_json(raw: Mapping[str, Any] | None) -> dict[str, FlagMap]:
    return {knob: FlagMap.from_dict(knob, d) for knob, d in (raw or {}).items() if knob in knobs.KNOBS}


def search_values(maps: Mapping[str, FlagMap]) -> dict[str, list]:
    """SEARCH for the knobs a map restricts to some values: those values and the knob's default (the script's own)."""
    return {knob: [knobs.KNOBS[knob].default, *[v for v in m.values if v != knobs.KNOBS[knob].default]]
            for knob, m in maps.items() if m.values}


def script_argv(args: Iterable[str], maps: Mapping[str, FlagMap], settings: Mapping[str, Any],
                baseline: Mapping[str, Any]) -> list[str]:
    """The script's arguments for `settings`: the user's, then the flags of the mapped knobs that differ from the
    baseline (argparse keeps an option's last occurrence, so an appended flag overrides the user's)."""
    argv = list(args)
    for knob, m in maps.items():
        value = settings.get(knob)
        if knob in settings and value != baseline.get(knob):
            argv += m.argv(value)
    return argv


def command_line(script: str, args: Iterable[str], maps: Mapping[str, FlagMap], settings: Mapping[str, Any],
                 baseline: Mapping[str, Any]) -> str | None:
    """`python train.py ARGS FLAGS` for the recommended `settings`, or None when no mapped knob changed."""
    base = list(args)
    argv = script_argv(base, maps, settings, baseline)
    if argv == base:
        return None
    return shlex.join(["python", script, *argv])


def unmapped_changes(maps: Mapping[str, FlagMap], settings: Mapping[str, Any],
                     baseline: Mapping[str, Any]) -> dict[str, Any]:
    """The changed knobs that no flag sets: the code snippet covers these."""
    return {k: v for k, v in settings.items() if baseline.get(k) != v and not (k in maps and maps[k].argv(v))}


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
