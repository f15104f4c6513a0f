"""Flag mapping for script mode: `--map KNOB=FLAG[:VALUE[=ARG],...]` lets the advisor set a knob through the script's
own command-line flag, and shows the recommendation as the command line to run. Pure Python (no torch).

    batch_size=--batch-size          the knob's value is the flag's argument: --batch-size 128
    batch_size=--batch_size=         a FLAG ending in '=' takes its value joined: --batch_size=128 (configurator,
                                     absl, fire style)
    batch_size=training.batch_size=  ... also without a dash: a Hydra-style override, training.batch_size=128
    channels_last=--channels-last    a bool knob: the bare flag when true, nothing when false (argparse store_true);
                                     a joined flag always carries the value (--compile=True, --compile=False)
    amp=--precision:bf16             only these values go through the flag: --precision bf16
    amp=--precision:bf16=bf16-mixed  ... with the script's own spelling of the value: --precision bf16-mixed

A knob at the script's own (baseline) value adds no flag: the script's default or the user's arguments stand. A
mapped flag the user's arguments already give is replaced where it stands (Hydra refuses a key given twice);
otherwise it is appended.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .. import knobs
from ..errors import UsageError

MAX_NOTED_WRITES = 10  # paths a report's note names of what the script wrote
MAP_HELP = "KNOB=FLAG, KNOB=FLAG:VALUE or KNOB=FLAG:VALUE=ARG (e.g. batch_size=--batch-size, amp=--precision:bf16)"


@dataclass(frozen=True)
class FlagMap:
    """One knob set through one flag; `values`: knob value -> the flag's argument, or empty for every value."""

    knob: str
    flag: str
    values: dict[Any, str] = field(default_factory=dict)

    @property
    def joined(self) -> bool:
        """Whether the value is joined to the flag (`--batch_size=64`, `training.batch_size=64`)."""
        return self.flag.endswith("=")

    def argv(self, value: Any) -> list[str]:
        """The arguments that set the knob to `value` ([] when the flag cannot express it)."""
        if self.values:
            arg = self.values.get(value)
        elif knobs.KNOBS[self.knob].type is bool and not self.joined:
            return [self.flag] if value else []
        else:
            arg = str(value)
        if arg is None:
            return []
        return [self.flag + arg] if self.joined else [self.flag, arg]

    def given(self, args: list[str]) -> tuple[int, int] | None:
        """Where the user's `args` already give this flag: (index, how many arguments), the last occurrence."""
        found = None
        for i, arg in enumerate(args):
            if self.joined and arg.startswith(self.flag):
                found = (i, 1)
            elif not self.joined and arg.startswith(self.flag + "="):
                found = (i, 1)
            elif not self.joined and arg == self.flag:
                bare = knobs.KNOBS[self.knob].type is bool and not self.values
                found = (i, 1 if bare or i + 1 == len(args) else 2)
        return found

    def value_in(self, args: list[str]) -> Any:
        """The knob value the user's `args` set through this flag (None: not given, or not a value of the knob)."""
        where = self.given(args)
        if where is None:
            return None
        i, n = where
        if n == 2:
            text = args[i + 1]
        elif self.joined or "=" in args[i]:
            text = args[i][len(self.flag):] if self.joined else args[i].partition("=")[2]
        else:
            return True  # a bare bool flag
        spelled = {arg: value for value, arg in self.values.items()}
        try:
            return spelled[text] if text in spelled else knobs.KNOBS[self.knob].parse(text)
        except ValueError:
            return None

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
    if any(c.isspace() for c in flag) or not flag.strip("-=") or not (flag.startswith("-") or flag.endswith("=")):
        raise UsageError(f"{where}: '{flag}' is not a flag; a flag starts with '-' (e.g. --batch-size), or ends "
                         "with '=' to take its value joined (--batch_size=, or a Hydra-style training.batch_size=)")
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
    """The script's arguments for `settings`: the user's, with the flags of the mapped knobs that differ from the
    baseline put where the user gave them, else appended (argparse and configurator-style scripts keep an option's
    last occurrence; Hydra refuses a key given twice)."""
    argv = list(args)
    for knob, m in maps.items():
        value = settings.get(knob)
        if knob not in settings or value == baseline.get(knob):
            continue
        where = m.given(argv)
        if where is None:
            argv += m.argv(value)
        elif m.argv(value):
            argv[where[0]:where[0] + where[1]] = m.argv(value)
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


def script_notes(facts: Mapping[str, Any], probes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The report's notes on a script's run: where its batch size came from when no DataLoader shows it, and what
    it wrote (in each probe's scratch folder, not the caller's tree: script/mirror.py), from the inspection's facts
    (`workload.facts.extra.script`) and the probes' records."""
    notes = []
    given = facts.get("batch_size_from")
    if given:
        notes.append(f"batch size: the script builds no DataLoader, so batch_size is its {given['flag']} flag: "
                     f"{given['value']} on its command line (the baseline), {given['value']} samples per backward()")
    wrote: dict[str, None] = dict.fromkeys(facts.get("wrote") or [])
    for probe in probes:
        wrote.update(dict.fromkeys(((probe.get("extra") or {}).get("script") or {}).get("wrote") or []))
    if wrote:
        shown = list(wrote)[:MAX_NOTED_WRITES]
        more = f" and {len(wrote) - len(shown)} more" if len(wrote) > len(shown) else ""
        notes.append(f"the script wrote {', '.join(shown)}{more}: in each probe's scratch folder, not in yours")
    return notes
