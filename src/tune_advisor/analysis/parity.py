"""Loss parity: did a speed knob change training, not only its speed?

Every probe starts from the same seed (weights, data order), so two probes whose settings differ only in knobs that
change arithmetic (AMP, torch.compile, matmul precision) see the same batches in the same order and their losses
should agree step by step up to rounding. Pure Python over the saved `raw.loss` lists: the planner, the rules and
the tests share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

# Knobs that change the arithmetic but not which batches a step sees, with the value that is the float32 reference.
NUMERIC_KNOBS = {"amp": "off", "compile": "off", "matmul_precision": "highest"}
TOLERANCE = 0.05  # a mean relative difference above 5% means the knob changed the training
MIN_STEPS = 3  # fewer common finite steps than this say nothing


@dataclass(frozen=True)
class Parity:
    difference: float  # mean |loss - reference loss| over the mean of the larger of the two, on the common steps
    steps: int

    @property
    def ok(self) -> bool:
        return self.difference <= TOLERANCE


def reference_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The same settings with every numeric knob at its float32 value."""
    return {**settings, **{k: v for k, v in NUMERIC_KNOBS.items() if k in settings}}


def numeric_changes(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The numeric knobs these settings move away from float32."""
    return {k: settings[k] for k, v in NUMERIC_KNOBS.items() if k in settings and settings[k] != v}


def compare(reference: Sequence[float | None], candidate: Sequence[float | None]) -> Parity | None:
    """Parity of two loss sequences over their common measured steps (steps where either is not finite are left
    out: divergence is the `diverged` status's business). None when too few steps are comparable."""
    pairs = [(x, y) for x, y in zip(reference, candidate) if x is not None and y is not None]
    # Relative to the larger loss of each step: a reference that learns to ~0 while the candidate stays at chance
    # reads as a 100% difference, not as a ratio blown up by a near-zero denominator.
    scale = sum(max(abs(x), abs(y)) for x, y in pairs)
    if len(pairs) < MIN_STEPS or scale == 0:
        return None
    return Parity(sum(abs(y - x) for x, y in pairs) / scale, len(pairs))


def describe(changes: Mapping[str, Any], parity: Parity) -> str:
    what = ", ".join(f"{k}={v}" for k, v in changes.items())
    return (f"{what} changed the loss: over {parity.steps} measured steps it differs from float32 by "
            f"{parity.difference:.0%} on average (tolerance {TOLERANCE:.0%})")
