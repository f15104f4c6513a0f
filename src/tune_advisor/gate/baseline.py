"""perf/baseline.json: several rounds of one configuration with the machine they ran on, and reading it back.

The file is versioned like results.json (`schema_version`) and read forgivingly: keys added later get defaults.
Its keys are documented in docs/ci-gating.md.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import results
from ..errors import TuneAdvisorError, UsageError
from ..probe.result import ProbeResult
from ..probe.spec import Protocol
from .verdict import Round, Sample

KIND = "tune-advisor-baseline"
SCHEMA_VERSION = 1
EXIT_OTHER_HARDWARE = 3


class OtherHardware(TuneAdvisorError):
    """The baseline was measured on a machine or software stack that differs in a way that changes speed."""

    exit_code = EXIT_OTHER_HARDWARE

    def __init__(self, path: Path | str, differences: list[tuple[str, Any, Any]]):
        self.path, self.differences = str(path), differences
        listed = "; ".join(f"{name}: {_show(old)} (baseline) vs {_show(new)} (here)" for name, old, new in differences)
        super().__init__(
            f"{path} was recorded on different hardware or software ({listed}). Timings from another machine say "
            f"nothing about this change. Record a baseline on this kind of runner (tune-advisor baseline), compare "
            f"with a git ref measured in this job (--against REF), or pass --allow-other-hardware to compare anyway.")


# The facts that change measured speed, as (label, getter over an environment dict). A wider list than
# environment.fingerprint(): the CUDA version and the GPU driver change kernel choice and speed too.
FACTS = (
    ("device", lambda e: e.get("device")),
    ("GPU model", lambda e: (e.get("gpu") or {}).get("name")),
    ("GPU memory", lambda e: (e.get("gpu") or {}).get("memory_total_bytes")),
    ("GPU driver", lambda e: (e.get("gpu") or {}).get("driver")),
    ("CUDA", lambda e: (e.get("gpu") or {}).get("cuda")),
    ("torch", lambda e: e.get("torch")),
    ("CPU model", lambda e: e.get("cpu_model") or e.get("device_name")),
    ("CPU cores", lambda e: e.get("cpu_count")),
)


def hardware_facts(environment: dict[str, Any]) -> dict[str, Any]:
    return {name: get(environment or {}) for name, get in FACTS}


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(fact, baseline value, current value) for every speed-relevant fact that differs."""
    old, new = hardware_facts(recorded), hardware_facts(current)
    return [(name, old[name], new[name]) for name in old if old[name] != new[name]]


@dataclass
class Baseline:
    path: Path
    document: dict[str, Any]

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.document.get("settings") or {})

    @property
    def environment(self) -> dict[str, Any]:
        return dict(self.document.get("environment") or {})

    @property
    def protocol(self) -> Protocol:
        known = {f.name for f in dataclasses.fields(Protocol)}
        return Protocol(**{k: v for k, v in (self.document.get("protocol") or {}).items() if k in known})

    @property
    def rounds(self) -> list[ProbeResult]:
        return [ProbeResult.from_dict(p) for p in self.document.get("rounds") or []]

    @property
    def unit(self) -> str:
        return (self.document.get("summary") or {}).get("throughput", {}).get("unit") or "samples/s"

    def sample(self) -> Sample:
        return sample_of(self.rounds, self.unit)


def sample_of(probes: list[ProbeResult], unit: str | None = None) -> Sample:
    """The successful probes as rounds for the verdict."""
    rounds = [Round(list(p.step_s), list(p.items) or [1.0] * len(p.step_s), p.peak_memory_bytes)
              for p in probes if p.ok and p.step_s]
    return Sample(rounds, unit or (probes[0].unit if probes else "samples/s"))


def summary(sample: Sample) -> dict[str, Any]:
    """Per-round figures and their spread: what a person reads in the file; the gate recomputes from raw."""
    def per_round(metric: str) -> dict[str, Any]:
        values = [None if v != v else round(float(v), 9) for v in sample.values(metric)]
        return {"median": _round(sample.level(metric)), "rounds": values, "spread": round(sample.spread(metric), 6)}

    memory = per_round("peak_memory")
    memory = {"median": int(memory["median"]) if memory["median"] else None,
              "rounds": [int(v) if v else None for v in memory["rounds"]], "spread": memory["spread"]}
    return {"throughput": {**per_round("throughput"), "unit": sample.unit}, "step_time_s": per_round("step_time"),
            "peak_memory_bytes": memory}


def new_document(*, command: list[str], environment: dict[str, Any], workload: dict[str, Any],
                 settings: dict[str, Any], protocol: Protocol, probes: list[ProbeResult]) -> dict[str, Any]:
    return {
        **results.header(command, environment, workload),
        "schema_version": SCHEMA_VERSION,  # the baseline file's own schema
        "kind": KIND,
        "settings": dict(settings),
        "protocol": dataclasses.asdict(protocol),
        "summary": summary(sample_of(probes)),
        "rounds": [p.to_dict() for p in probes],
    }


def read(path: Path | str) -> Baseline:
    """Read and check a baseline file. Every problem is a UsageError (exit 2) saying what to do."""
    path = Path(path)
    record = f"record one with: tune-advisor baseline WORKLOAD.py -o {path}"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{path}: no such baseline file; {record}") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a folder, not a baseline file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not a readable baseline (corrupt JSON: {exc}); {record}") from None
    if not isinstance(document, dict) or not isinstance(document.get("schema_version"), int):
        raise UsageError(f"{path}: not a tune-advisor baseline (no schema_version); {record}")
    if document.get("kind") != KIND:
        hint = " (it looks like an analysis results.json)" if "probes" in document else ""
        raise UsageError(f"{path}: not a tune-advisor baseline{hint}; {record}")
    if document["schema_version"] > SCHEMA_VERSION:
        raise UsageError(f"{path}: written by a newer tune-advisor (baseline schema {document['schema_version']}; "
                         f"this one reads up to {SCHEMA_VERSION}); upgrade tune-advisor or re-record the baseline")
    baseline = Baseline(path, document)
    try:
        usable = baseline.sample().rounds
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{path}: a round is malformed ({exc!r}); {record}") from None
    if not usable:
        raise UsageError(f"{path}: holds no successful round with step samples; {record}")
    return baseline


def _round(x: float) -> float | None:
    return None if x != x else round(float(x), 9)


def _show(value: Any) -> str:
    if isinstance(value, int) and value > 2**30:
        return f"{value / 2**30:.1f} GiB"
    return "none" if value is None else str(value)
