"""results.json: the stable, versioned record of a run (SPEC §7), written atomically after every probe.

Its shape is the typed record in record.py: `read` refuses a file it rejects, `read_record` returns it typed, and
`RunRecord.save` validates through it before writing.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from . import __version__, knobs, record
from .errors import UsageError
from .files import write_json_atomic
from .probe.result import ProbeResult, Status
from .record import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "RunRecord", "best_so_far", "header", "new_document", "read", "read_record",
           "write_atomic"]


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


class RunRecord:
    """The results.json of one analysis, and the only writer of its document while the run goes on. The methods
    change the document; `save` writes it, atomically (analyze saves after every probe, so a killed run leaves the
    probes that finished)."""

    def __init__(self, path: Path, document: dict[str, Any]):
        self.path, self.document = Path(path), document

    @classmethod
    def start(cls, path: Path, *, command: list[str], environment: dict, workload: dict, limit_s: float | None,
              memory_budget_bytes: int | None, execution: dict[str, Any], identity: dict[str, Any]) -> "RunRecord":
        """A running analysis's new document (not yet saved); `identity` (rundir.identity) is what a resumed run
        must share with it."""
        document = new_document(command, environment, workload)
        document["budget"].update(limit_s=limit_s, memory_budget_bytes=memory_budget_bytes)
        document["execution"] = execution
        document["run"] = {"state": "running", **identity, "resumed": []}
        return cls(path, document)

    def continues(self, previous: dict[str, Any]) -> None:
        """This run resumes the interrupted run of `previous` (its document): the resumes before it are kept."""
        earlier = previous.get("run", {}).get("resumed")
        self.document["run"]["resumed"] = list(earlier) if isinstance(earlier, list) else []

    def set_peaks(self, flops_per_s: Any, status: str) -> None:
        """The machine's peak FLOP/s (collectors.flops.ensure_peaks), for MFU."""
        self.document["environment"]["peaks"] = {"status": status, "flops_per_s": flops_per_s}

    def add_probe(self, entry: dict[str, Any]) -> None:
        """A finished probe: its PROBE object."""
        self.document["probes"].append(entry)

    def spent(self, *, used_s: float, probes_run: int, unexplored: list[str]) -> None:
        """The budget spent so far, and what the plan left unexplored."""
        self.document["budget"].update(used_s=used_s, probes_run=probes_run, unexplored=list(unexplored))

    def resumed(self, reused: list[str], discarded: list[str]) -> None:
        """Which of the interrupted run's probes this run reused, and which it discarded (ids)."""
        self.document["run"]["resumed"].append({"reused": list(reused), "discarded": list(discarded)})

    def provisional(self, best: dict[str, Any] | None) -> None:
        """The plan's best so far while the run goes on (`best_so_far`: provisional, not confirmed; None before the
        baseline measured), written by the next `save`. The first one that changes something also sets
        `budget.first_provisional_s`, which the complete document keeps."""
        if best is None:
            self.document.pop("best_so_far", None)
            return
        self.document["best_so_far"] = best
        if best["changes"] and self.document["budget"].get("first_provisional_s") is None:
            self.document["budget"]["first_provisional_s"] = best.get("elapsed_s")

    def phase(self, name: str, seconds: float) -> None:
        """How long a part of the run outside the probes took (`budget.phases`: inspection_s, calibration_s, ...)."""
        self.document["budget"].setdefault("phases", {})[name] = round(seconds, 3)

    def interrupted(self, notes: list[str], best: dict[str, Any] | None = None) -> None:
        """Stopped (Ctrl-C) before a recommendation: the probes that finished stay, and `best`, the plan's best so far
        (`best_so_far`: a candidate, not confirmed), where the baseline had measured."""
        self.document["run"]["state"] = "interrupted"
        self.document["notes"] = notes
        if best is not None:
            self.document["best_so_far"] = best
        else:
            self.document.pop("best_so_far", None)

    def complete(self, *, baseline: dict[str, Any], recommended: dict[str, Any], speedup: dict[str, Any] | None,
                 figures: dict[str, Any], notes: list[str], plan: dict[str, Any],
                 unconfirmed: dict[str, Any] | None = None) -> None:
        """The recommendation and how it was found, and the winner its confirmation could not tell from the noise
        (`unconfirmed`, where one was); the findings, which the rules derive from it, follow. The provisional best so
        far goes: the recommendation is the answer now."""
        self.document["run"]["state"] = "complete"
        self.document.pop("best_so_far", None)
        self.document.pop("unconfirmed", None)
        if unconfirmed is not None:
            self.document["unconfirmed"] = unconfirmed
        self.document.update(baseline=baseline, recommended=recommended, speedup=speedup, figures=figures,
                             notes=notes, plan=plan)

    def set_findings(self, findings: list[dict[str, Any]]) -> None:
        """The rules' findings (rules.evaluate over this document)."""
        self.document["findings"] = findings

    def save(self) -> None:
        """Write the document, once the typed record accepts it (the text as it will read back: a document the
        tool's own schema rejects is a bug here, never a file a later `report` refuses)."""
        try:
            record.Document.model_validate_json(json.dumps(self.document))
        except record.ValidationError as exc:
            raise ValueError(f"results.json would not match its schema: {record.problem(exc)}") from None
        write_atomic(self.path, self.document)


def best_so_far(baseline: ProbeResult, best: ProbeResult, gain: tuple[float, float, float],
                elapsed_s: float | None = None) -> dict[str, Any]:
    """The plan's best so far (results.json `best_so_far`), provisional while the run goes on and what an interrupted
    run leaves: the probe, what it changes from the baseline, its measured gain (`gain`: median and 95% CI of
    best/baseline throughput; null where not measurable), `confirmed: false` (no confirmation measured it again
    beside the baseline) and `elapsed_s`, when the plan kept it, where given. The baseline itself where nothing
    beat it yet (no changes, gain 1)."""
    changes = knobs.changes(best.settings, baseline.settings)
    median, low, high = (None if value != value else round(value, 4) for value in gain)  # NaN: null
    found = {} if elapsed_s is None else {"elapsed_s": round(elapsed_s, 3)}
    return {"probe": best.id, "changes": changes, "gain": {"median": median, "ci": [low, high]}, "confirmed": False,
            **found}


def write_atomic(path: Path, document: dict[str, Any]) -> None:
    """Write results.json atomically (files.write_json_atomic): a kill never leaves half a file.

    A write that fails (full disk, folder gone read-only) leaves the previous file as it was and raises UsageError.
    """
    path = Path(path)
    try:
        write_json_atomic(path, document, mode=0o600)  # owner-only, as results.json has always been written
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}"
                         + ("; the previous version is kept" if path.exists() else "")) from None


# The top-level keys the tool relies on and the JSON types each may have; probe statuses (probe.result.Status).
_NULL = type(None)
_SHAPE: dict[str, tuple[type, ...]] = {
    "tool": (dict,), "command": (list,), "environment": (dict,), "workload": (dict,), "baseline": (dict, _NULL),
    "recommended": (dict, _NULL), "speedup": (dict, _NULL), "probes": (list,), "findings": (list,),
    "notes": (list,), "plan": (dict,), "budget": (dict,), "run": (dict,),
}
_STATUSES = tuple(status.value for status in Status)


def read(path: Path) -> dict[str, Any]:
    """Read and check a results.json. Anything the tool cannot use (not JSON, cut off, a newer schema, keys of the
    wrong type, a probe without id/settings/status, anything else the typed record rejects) raises UsageError saying
    what is wrong and where, never a traceback. Returns the document as JSON gives it; `read_record` types it."""
    return _checked(Path(path))[0]


def read_record(path: Path) -> record.Document:
    """Read and check a results.json, as `read` does, and return its typed record."""
    return _checked(Path(path))[1]


def _checked(path: Path) -> tuple[dict[str, Any], record.Document]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a results.json (not UTF-8 text)") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        why = "it ends early: the file was cut off" if _unclosed(text) else "it was edited by hand or damaged"
        raise UsageError(f"{path}: not a readable results.json: invalid JSON at line {exc.lineno} column "
                         f"{exc.colno} ({exc.msg}); {why}") from None
    except RecursionError:
        raise UsageError(f"{path}: not a readable results.json: nested too deeply") from None
    version = document.get("schema_version") if isinstance(document, dict) else None
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UsageError(f"{path}: not a tune-advisor results.json (no schema_version)")
    if version > SCHEMA_VERSION:
        raise UsageError(f"{path}: written by a newer tune-advisor (schema {version}; this one reads up to "
                         f"{SCHEMA_VERSION}); upgrade tune-advisor")
    problem = _shape_problem(document)
    try:
        typed = record.parse(document) if problem is None else None
    except record.ValidationError as exc:
        problem = record.problem(exc)
    if problem:
        raise UsageError(f"{path}: not a usable results.json: {problem}; was it edited by hand?")
    return document, typed


def _unclosed(text: str) -> bool:
    """Whether the text ends inside a string or with brackets still open, as a file cut short does."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if escaped:
            escaped = False
        elif in_string:
            escaped, in_string = ch == "\\", ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return in_string or depth > 0 or not text.strip()


def _shape_problem(document: dict[str, Any]) -> str | None:
    """The commonest ways a document is unusable, said in words, or None; the typed record checks the rest."""
    if "probes" not in document:
        return "it has no 'probes' list"
    for key, types in _SHAPE.items():
        if key in document and not isinstance(document[key], types):
            return f"'{key}' must be {' or '.join(map(_kind, types))}, not {_kind(type(document[key]))}"
    for i, probe in enumerate(document["probes"]):
        if not isinstance(probe, dict):
            return f"probes[{i}] must be an object, not {_kind(type(probe))}"
        if not isinstance(probe.get("id"), str) or not isinstance(probe.get("settings"), dict):
            return f"probes[{i}] needs a string 'id' and a 'settings' object"
        if probe.get("status") not in _STATUSES:
            return f"probes[{i}] ({probe['id']}): status {probe.get('status')!r} is not one of {', '.join(_STATUSES)}"
    for key in ("baseline", "recommended"):  # a probe too, as the summaries read it
        if isinstance(document.get(key), dict) and not isinstance(document[key].get("settings"), dict):
            return f"'{key}' needs a 'settings' object"
    return None


def _kind(t: type) -> str:
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
            bool: "true/false", _NULL: "null"}.get(t, t.__name__)
