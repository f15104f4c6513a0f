"""Gate checks: small objects parsed from strings like `throughput:5%`, each judging the evidence on its own.

Forms (docs/ci-gating.md):

    throughput:5%          fail if throughput dropped by more than 5% (significantly)
    step_time:5%           fail if the mean step time grew by more than 5% (significantly)
    peak_memory:10%        fail if peak memory grew by more than 10% in every round
    throughput:>=1200      fail if throughput is significantly below 1200 items/s
    step_time:<=50ms       fail if the mean step time is significantly above 50 ms (also 0.05s, 0.05)
    peak_memory:<=2GiB     fail if peak memory is above 2 GiB in every round (also 512MB, bytes)

Each check returns an Outcome whose `failure` is a message with the numbers, or None.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import UsageError
from . import verdict
from .verdict import INTERLEAVED, Evidence

METRICS = ("throughput", "step_time", "peak_memory")
PASS, WARN, FAIL, ERROR = "pass", "warn", "fail", "error"
FORMS = ("throughput:5%, step_time:5%, peak_memory:10% (relative to the reference), or throughput:>=1200, "
         "step_time:<=50ms, peak_memory:<=2GiB (absolute)")


@dataclass
class Outcome:
    """How one check went. `status` is pass, warn (a change below significance or effect size), fail, or error
    (the check could not be evaluated)."""

    check: "Check"
    status: str
    message: str
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def failure(self) -> str | None:
        return self.message if self.status in (FAIL, ERROR) else None

    @property
    def undecided(self) -> bool:
        """Beyond the allowed change or limit, but not significantly: more rounds can decide it (a peak-memory
        warning cannot: its rounds disagree, and more of them would not agree)."""
        return self.status == WARN and self.check.metric != "peak_memory"

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check.text, "metric": self.check.metric, "kind": self.check.kind,
                "threshold": self.check.threshold, "status": self.status, "message": self.message,
                "figures": _json_safe(self.figures)}


def _json_safe(value: Any) -> Any:
    """JSON has no NaN/inf (gate.json is written with allow_nan=False): a non-finite figure becomes null."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return float(value) if isinstance(value, np.floating) else value


@dataclass(frozen=True)
class Check:
    text: str  # as the user wrote it, normalised
    metric: str
    threshold: float  # relative: a fraction (0.05); bound: items/s, seconds or bytes

    kind = "check"
    needs_reference = False

    def evaluate(self, evidence: Evidence) -> Outcome:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class RelativeCheck(Check):
    """The metric may not get worse than the reference by more than `threshold` (a fraction)."""

    kind = "relative"
    needs_reference = True

    @property
    def allowed(self) -> str:
        return f"{self.threshold * 100:g}%"

    def evaluate(self, evidence: Evidence) -> Outcome:
        if evidence.reference is None:
            return Outcome(self, ERROR, f"{self.text}: no reference to compare with (give --baseline or --against)")
        if self.metric == "peak_memory":
            return self._memory(evidence)
        ratio = evidence.ratio(self.metric)
        higher = verdict.HIGHER_IS_BETTER[self.metric]
        bad = 1 - self.threshold if higher else 1 + self.threshold
        worse = (lambda x: x < bad) if higher else (lambda x: x > bad)  # beyond the allowed change
        change = ratio.median - 1
        # Each side's level is the one the bound checks print for it; the change is the ratio's, which pairs
        # rounds (interleaved) or resamples them: the two levels' quotient need not equal it, so the message
        # says which figure is which rather than print "880 vs 1,000" beside "dropped 13.0%".
        cand, ref = (evidence.level(self.metric, side).median for side in ("candidate", "reference"))
        figures = {"ratio": ratio.to_dict(), "candidate": cand, "reference": ref, "mode": evidence.mode}
        what = "throughput" if self.metric == "throughput" else "mean step time"
        rounds = (f"{len(evidence.candidate.rounds)} paired rounds" if evidence.mode == INTERLEAVED else
                  f"{len(evidence.candidate.rounds)} rounds against {len(evidence.reference.rounds)} stored")
        shown = (f"levels {_fmt(self.metric, cand, evidence)} vs {_fmt(self.metric, ref, evidence)} (each side's "
                 f"mean over its rounds)")
        ci = f"{ratio.median:.3f}x over {rounds} (95% CI {ratio.low:.3f}–{ratio.high:.3f}"
        if evidence.mode == INTERLEAVED:
            # Same job, alternating rounds: drift cancels, so the usual pair of tests applies: the change is
            # larger than the threshold, and the CI excludes "no change".
            ci += ")"
            significant = ratio.high < 1 if higher else ratio.low > 1
            failed = worse(ratio.median) and significant
        else:
            # Another job: the CI widened by the recorded run-to-run spread must lie wholly beyond the threshold.
            ci += f"; widened by the ±{ratio.allowance:.1%} run-to-run spread: " \
                  f"{ratio.wide_low:.3f}–{ratio.wide_high:.3f})"
            failed = worse(ratio.wide_high if higher else ratio.wide_low)
        if not all(map(_finite, (ratio.median, ratio.low, ratio.high))):
            return Outcome(self, ERROR, f"{self.text}: no usable step samples to compare", figures)
        direction = "dropped" if change < 0 else "rose"
        if failed:
            return Outcome(self, FAIL, f"{what} {direction} {abs(change):.1%} (allowed {self.allowed}): "
                                       f"ratio {ci}; {shown}", figures)
        if worse(ratio.median):
            return Outcome(self, WARN, f"{what} {direction} {abs(change):.1%}, beyond the allowed "
                                       f"{self.allowed} but not significantly: ratio {ci}; {shown}", figures)
        allowed = f" (allowed {self.allowed})" if (change < 0 if higher else change > 0) else ""
        return Outcome(self, PASS, f"{what} {direction} {abs(change):.1%}{allowed}: ratio {ci}; {shown}", figures)

    def _memory(self, evidence: Evidence) -> Outcome:
        ratios = verdict.memory_ratio(evidence.candidate, evidence.reference)
        if ratios is None:
            return Outcome(self, ERROR, f"{self.text}: peak memory was not measured on one side")
        figures = {**ratios, "candidate": evidence.candidate.level("peak_memory"),
                   "reference": evidence.reference.level("peak_memory"), "mode": evidence.mode}
        shown = (f"{_bytes(figures['candidate'])} vs {_bytes(figures['reference'])} "
                 f"(smallest round {_bytes(ratios['candidate_min'])} vs largest reference round "
                 f"{_bytes(ratios['reference_max'])})")
        grew = ratios["median"] - 1
        if ratios["worst_case"] > 1 + self.threshold:
            return Outcome(self, FAIL, f"peak memory grew {grew:.1%} (allowed {self.allowed}) in every "
                                       f"round: {shown}", figures)
        if ratios["median"] > 1 + self.threshold:
            return Outcome(self, WARN, f"peak memory grew {grew:.1%}, beyond the allowed {self.allowed} "
                                       f"but not in every round: {shown}", figures)
        return Outcome(self, PASS, f"peak memory changed {grew:+.1%} (allowed {self.allowed}): {shown}",
                       figures)


@dataclass(frozen=True)
class BoundCheck(Check):
    """The metric must stay on the right side of an absolute limit: a floor for throughput, a ceiling otherwise."""

    kind = "bound"

    def evaluate(self, evidence: Evidence) -> Outcome:
        limit = self.threshold
        if self.metric == "peak_memory":
            values = evidence.candidate.values("peak_memory")
            values = values[np.isfinite(values)]
            if not values.size:
                return Outcome(self, ERROR, f"{self.text}: peak memory was not measured")
            figures = {"min": float(values.min()), "max": float(values.max()), "limit": limit}
            shown = (f"{_bytes(values.min())}–{_bytes(values.max())} over {values.size} round(s), "
                     f"limit {_bytes(limit)}")
            if values.min() > limit:
                return Outcome(self, FAIL, f"peak memory above the limit in every round: {shown}", figures)
            if values.max() > limit:
                return Outcome(self, WARN, f"peak memory above the limit in some rounds: {shown}", figures)
            return Outcome(self, PASS, f"peak memory within the limit: {shown}", figures)
        level = evidence.level(self.metric)
        if not _finite(level.median):
            return Outcome(self, ERROR, f"{self.text}: no usable step samples")
        figures = {"level": level.to_dict(), "limit": limit}
        shown = (f"{_fmt(self.metric, level.median, evidence)} (95% CI {_fmt(self.metric, level.low, evidence)}–"
                 f"{_fmt(self.metric, level.high, evidence)}), limit {_fmt(self.metric, limit, evidence)}")
        floor = self.metric == "throughput"
        name = "throughput" if floor else "mean step time"
        beyond_all = level.high < limit if floor else level.low > limit
        beyond_mid = level.median < limit if floor else level.median > limit
        side = "below the floor" if floor else "above the ceiling"
        if beyond_all:
            return Outcome(self, FAIL, f"{name} {side}: {shown}", figures)
        if beyond_mid:
            return Outcome(self, WARN, f"{name} {side} but not significantly: {shown}", figures)
        return Outcome(self, PASS, f"{name} within the limit: {shown}", figures)


_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_RELATIVE = re.compile(rf"\+?{_NUMBER}\s*%")
_BOUND = re.compile(r"(?P<op>>=|<=|>|<|==?)\s*(?P<value>.+)")


def parse_check(text: str) -> Check:
    """'throughput:5%' -> a Check. Raises UsageError naming the valid forms for anything else."""
    raw = str(text)
    name, colon, shown = raw.partition(":")
    metric, rest = name.strip().lower().replace("-", "_"), shown.strip().lower()
    if metric not in METRICS or not colon:
        close = difflib.get_close_matches(metric, METRICS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close and colon else ""
        raise UsageError(f"--check {raw!r}: unknown check{hint}; use METRIC:LIMIT with METRIC one of "
                         f"{', '.join(METRICS)}, e.g. {FORMS}")
    relative = _RELATIVE.fullmatch(rest)
    if relative:
        fraction = float(relative.group(1)) / 100
        if fraction <= 0 or (metric == "throughput" and fraction >= 1):
            raise UsageError(f"--check {raw!r}: the allowed change must be above 0%"
                             + (" and below 100%" if metric == "throughput" else ""))
        return RelativeCheck(f"{metric}:{relative.group(1)}%", metric, fraction)
    bound = _BOUND.fullmatch(rest)
    if not bound:
        raise UsageError(f"--check {raw!r}: cannot read the limit {rest!r}; use e.g. {FORMS}")
    op, value = bound.group("op"), bound.group("value").strip()
    wanted = ">=" if metric == "throughput" else "<="
    if op != wanted:
        what = "a floor: throughput:>=N (items/s)" if metric == "throughput" else f"a ceiling: {metric}:<=LIMIT"
        raise UsageError(f"--check {raw!r}: {metric} takes {what}")
    limit = _limit(metric, value, raw)
    if limit <= 0:
        raise UsageError(f"--check {raw!r}: the limit must be above 0")
    return BoundCheck(f"{metric}:{wanted}{shown.strip()[len(op):].strip()}", metric, limit)


def parse_checks(texts: list[str] | tuple[str, ...]) -> list[Check]:
    """Parse every check; the same check twice is kept once."""
    checks: list[Check] = []
    for text in texts:
        check = parse_check(text)
        if check not in checks:
            checks.append(check)
    return checks


def _limit(metric: str, value: str, raw: str) -> float:
    if metric == "throughput":
        match = re.fullmatch(rf"{_NUMBER}\s*(?:[a-z_]+/s)?", value)  # '1200' or '1200 samples/s'
        if match:
            return float(match.group(1))
        raise UsageError(f"--check {raw!r}: a throughput floor is a number of items/s, e.g. throughput:>=1200")
    if metric == "step_time":
        match = re.fullmatch(rf"{_NUMBER}\s*(ms|s)?", value)
        if match:
            return float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
        raise UsageError(f"--check {raw!r}: a step-time ceiling is a duration, e.g. step_time:<=50ms or 0.05s")
    match = re.fullmatch(rf"{_NUMBER}\s*([kmgt]?)(i?b)?", value)
    if match:
        return float(match.group(1)) * 1024 ** " kmgt".index(match.group(2) or " ")
    raise UsageError(f"--check {raw!r}: a memory ceiling is a size, e.g. peak_memory:<=2GiB or 512MB")


def _finite(x: float) -> bool:
    return bool(np.isfinite(x))


def _fmt(metric: str, value: float, evidence: Evidence) -> str:
    if not _finite(value):
        return "-"
    if metric == "step_time":
        return f"{value * 1e3:.2f} ms"
    text = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return f"{text} {evidence.candidate.unit}"


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"
