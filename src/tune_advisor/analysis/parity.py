"""Loss parity: did a speed knob change training, not only its speed?

Every probe starts from the same seed (weights, data order), so two probes whose settings differ only in knobs that
change arithmetic (AMP, torch.compile, matmul precision) see the same batches in the same order and their losses
should agree step by step up to rounding. Pure Python over the saved `raw.loss` lists: the planner, the rules and
the tests share it.

"Step by step" means at the same global training step, not the same position in the lists: probes warm up for
different numbers of steps (torch.compile warms up until compilation settles, a loader until its prefetch queue is
drained), so the first measured loss of one probe may come from a later step than the other's. `raw.loss_step`
holds each loss's global step; results saved before it existed follow `extra.warmup_steps` consecutively.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

# Knobs that change the arithmetic but not which batches a step sees, with the value that is the float32 reference.
NUMERIC_KNOBS = {"amp": "off", "compile": "off", "matmul_precision": "highest"}
TOLERANCE = 0.05  # a mean relative difference above 5% means the knob changed the training
MIN_STEPS = 3  # fewer common finite steps than this say nothing


@dataclass(frozen=True)
class Parity:
    difference: float  # mean |loss - reference loss| over the mean of the larger of the two, on the common steps
    steps: int
    at: tuple[int, ...] | None = field(default=None, repr=False)  # the global steps compared; None: by position
    reference: tuple[float, ...] = field(default=(), repr=False)  # the compared losses, in step order
    candidate: tuple[float, ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        return self.difference <= TOLERANCE


def reference_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The same settings with every numeric knob at its float32 value."""
    return {**settings, **{k: v for k, v in NUMERIC_KNOBS.items() if k in settings}}


def numeric_changes(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The numeric knobs these settings move away from float32."""
    return {k: settings[k] for k, v in NUMERIC_KNOBS.items() if k in settings and settings[k] != v}


def barred(settings: Mapping[str, Any], changed: Mapping[tuple, Any]) -> Any:
    """What `changed` (numeric knob values found to change the loss, as sorted (knob, value) tuples) holds against
    these settings, or None: their own combination, or any one of their values, since a value barred alone is
    barred in every combination."""
    changes = tuple(sorted(numeric_changes(settings).items()))
    alone = next((changed[(item,)] for item in changes if (item,) in changed), None)
    return alone if alone is not None else changed.get(changes)


def losses_by_step(probe: Any) -> tuple[list[float | None], list[int] | None]:
    """(losses, their global steps) of a probe: a results.json PROBE dict or a ProbeResult.

    The steps are `raw.loss_step`; for results saved before that existed, `extra.warmup_steps + i` (the measured
    steps follow the warm-up without a gap); None when neither is known."""
    raw, extra = ((probe.get("raw"), probe.get("extra")) if isinstance(probe, Mapping)
                  else (getattr(probe, "raw", None), getattr(probe, "extra", None)))
    raw, extra = raw or {}, extra or {}
    losses = list(raw.get("loss") or [])
    steps = raw.get("loss_step")
    if steps is not None and len(steps) == len(losses) and all(s is not None for s in steps):
        return losses, [int(s) for s in steps]  # JSON may hold them as floats
    warmup = extra.get("warmup_steps")
    if isinstance(warmup, (int, float)) and not isinstance(warmup, bool):
        return losses, [int(warmup) + i for i in range(len(losses))]
    return losses, None


def compare(reference: Sequence[float | None], candidate: Sequence[float | None],
            reference_steps: Sequence[int] | None = None, candidate_steps: Sequence[int] | None = None,
            ) -> Parity | None:
    """Parity of two loss sequences over the global steps both measured (steps where either is not finite are left
    out: divergence is the `diverged` status's business). None when too few steps are comparable.

    With both step lists the losses are paired by global step; without them (or with only one) by position,
    which is right only when both probes warmed up for the same number of steps."""
    if reference_steps is not None and candidate_steps is not None:
        ref = dict(zip(reference_steps, reference))
        common = sorted(set(ref).intersection(candidate_steps))
        cand = dict(zip(candidate_steps, candidate))
        triples = [(s, ref[s], cand[s]) for s in common]
    else:
        triples = [(None, x, y) for x, y in zip(reference, candidate)]
    triples = [(s, x, y) for s, x, y in triples if x is not None and y is not None]
    # Relative to the larger loss of each step: a reference that learns to ~0 while the candidate stays at chance
    # reads as a 100% difference, not as a ratio blown up by a near-zero denominator.
    scale = sum(max(abs(x), abs(y)) for _, x, y in triples)
    if len(triples) < MIN_STEPS or scale == 0:
        return None
    aligned = reference_steps is not None and candidate_steps is not None
    return Parity(sum(abs(y - x) for _, x, y in triples) / scale, len(triples),
                  at=tuple(s for s, _, _ in triples) if aligned else None,
                  reference=tuple(x for _, x, _ in triples), candidate=tuple(y for _, _, y in triples))


def compare_probes(reference: Any, candidate: Any) -> Parity | None:
    """`compare` of two probes (PROBE dicts or ProbeResults) at the global steps both measured."""
    (a, a_steps), (b, b_steps) = losses_by_step(reference), losses_by_step(candidate)
    return compare(a, b, a_steps, b_steps)


def describe(changes: Mapping[str, Any], parity: Parity) -> str:
    what = ", ".join(f"{k}={v}" for k, v in changes.items())
    return (f"{what} changed the loss: over {parity.steps} measured steps it differs from float32 by "
            f"{parity.difference:.0%} on average (tolerance {TOLERANCE:.0%})")
