"""What a probe measured: raw samples from the child, summarised into the PROBE object of results.json."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..analysis import stats


class Status(str, Enum):
    OK = "ok"
    OOM = "oom"  # CUDA OOM, CPU allocator failure, or the kernel's OOM killer
    ERROR = "error"  # an exception, with the user-code frame and message
    TIMEOUT = "timeout"  # over the wall-clock limit: the process group was killed
    CRASHED = "crashed"  # died by a signal or exited without a result
    DIVERGED = "diverged"  # non-finite loss
    SKIPPED = "skipped"  # not applicable, or over budget
    # Not failures, and never held against a knob:
    STOPPED = "stopped"  # cut short before a whole window: the budget ran out, or its lockstep partner ended
    UNSUPPORTED = "unsupported"  # an operator has no kernel here for the knob's dtype or layout (oneDNN, ...)


@dataclass
class ProbeResult:
    id: str
    settings: dict[str, Any]
    status: Status
    error: str | None = None
    raw: dict[str, list] = field(default_factory=dict)  # step_s, data_wait_s, h2d_s, items, loss
    unit: str = "samples/s"
    peak_memory_bytes: int | None = None
    memory: dict[str, Any] = field(default_factory=dict)  # what the peak is made of
    applied: dict[str, Any] = field(default_factory=dict)  # evidence that each knob took effect in the child
    extra: dict[str, Any] = field(default_factory=dict)  # warm-up time, CPU utilisation, threads, ...
    gpu: dict[str, Any] | None = None
    wall_s: float = 0.0
    role: str = ""  # why the planner ran it: baseline, knob, batch-ladder, loader-ladder, combine, confirm
    seed: int = 0

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def stopped_by_partner(self) -> bool:
        """Whether it was stopped because its lockstep partner ended (probe/lockstep.py): half a comparison, not
        a failure of its own settings; the partner holds the cause."""
        return self.status is Status.STOPPED and "partner_status" in self.extra.get("lockstep", {})

    @property
    def measured(self) -> bool:
        """Whether it has a measured window to read figures from."""
        return bool(self.step_s) and sum(self.step_s) > 0

    @property
    def paired_with(self) -> str | None:
        """The partner's probe id when measured in lockstep, step by step beside it (None: measured alone).
        Figures of the two kinds differ systematically (the partner's turns leave the caches cold), so a
        comparison never mixes them."""
        return (self.extra.get("lockstep") or {}).get("partner")

    @property
    def wave(self) -> int:
        """Steps after which the step series repeats: a wave of batches from the loader (its worker count, see
        analysis.stats) and the optimizer's accumulation cycle, when a framework's loop accumulates."""
        return stats.period(int(self.settings.get("num_workers") or 0), int(self.extra.get("optimizer_every") or 1))

    @property
    def step_s(self) -> list[float]:
        return self.raw.get("step_s", [])

    @property
    def items(self) -> list[float]:
        return self.raw.get("items", [])

    def throughput(self) -> tuple[float, float, float]:
        return stats.throughput_ci(self.items, self.step_s, seed=self.seed, wave=self.wave)

    @property
    def throughput_median(self) -> float:
        return self.throughput()[0] if self.ok else float("nan")

    def data_wait_frac(self) -> float | None:
        """Share of the measured step time spent waiting for the next batch."""
        return self._share("data_wait_s")

    def copy_frac(self) -> float | None:
        """Share of the measured step time spent copying the batch to the device."""
        return self._share("h2d_s")

    def _share(self, key: str) -> float | None:
        total = sum(self.step_s)
        return sum(self.raw.get(key, [])) / total if total > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """The PROBE object of results.json (SPEC §7), plus the raw samples it was computed from."""
        median, low, high = self.throughput() if self.step_s else (None, None, None)
        losses = [x if x is not None and math.isfinite(x) else None for x in self.raw.get("loss", [])]
        return {
            "id": self.id,
            "role": self.role,
            "settings": dict(self.settings),
            "status": self.status.value,
            "error": self.error,
            "throughput": {"median": _num(median), "ci_low": _num(low), "ci_high": _num(high), "unit": self.unit},
            "step_time_s": {
                "median": _num(stats.median(self.step_s)) if self.step_s else None,
                "iqr": _num(stats.iqr(self.step_s)) if self.step_s else None,
                "samples": list(self.step_s),
            },
            "data_wait_frac": _num(self.data_wait_frac()),
            "peak_memory_bytes": self.peak_memory_bytes,
            "loss": {
                "first": _num(losses[0]) if losses else None,
                "last": _num(losses[-1]) if losses else None,
                "finite": all(x is not None for x in losses) if losses else None,
            },
            "gpu": self.gpu,
            "wall_s": round(self.wall_s, 3),
            "raw": {k: [_num(x) for x in v] for k, v in self.raw.items() if k != "step_s"},  # step_s is above
            "memory": self.memory,
            "applied": self.applied,
            "extra": self.extra,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ProbeResult":
        raw = dict(d.get("raw") or {})
        raw.setdefault("step_s", list(d.get("step_time_s", {}).get("samples", [])))
        return cls(
            id=d["id"], settings=dict(d["settings"]), status=Status(d["status"]), error=d.get("error"),
            raw=raw, unit=d.get("throughput", {}).get("unit", "samples/s"),
            peak_memory_bytes=d.get("peak_memory_bytes"), memory=d.get("memory") or {},
            applied=d.get("applied") or {}, extra=d.get("extra") or {}, gpu=d.get("gpu"),
            wall_s=d.get("wall_s", 0.0), role=d.get("role", ""), seed=d.get("seed", 0),
        )


def _num(x: float | None) -> float | None:
    """JSON has no NaN/inf: a non-finite figure is written as null."""
    if x is None or not math.isfinite(x):
        return None
    return float(x)
