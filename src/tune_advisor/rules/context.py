"""What rules read: a results.json document, with its probes pooled by settings and compared with statistics.

Rules never re-run anything and never look at the current machine: every fact comes from the document.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable

from .. import consistency, knobs
from ..analysis import parity, stats
from ..collectors.cuda_memory import footprint, judged_peak
from ..fmt import fmt_bytes
from ..planner.keep import MIN_GAIN as SIGNIFICANT_GAIN  # the planner's bar: rules judge gains the same way


def num(x: Any) -> float | None:
    """A JSON-safe number: None for missing or non-finite values."""
    if x is None or isinstance(x, bool):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def all_settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {**knobs.defaults(), **(settings or {})}  # a document from before a knob existed ran at its default


@dataclass
class Config:
    """Every `ok` probe of one combination of settings, pooled: confirmation repeats measure the same thing."""

    settings: dict[str, Any]
    probes: list[dict[str, Any]] = field(default_factory=list)

    def __getitem__(self, knob: str) -> Any:
        return self.settings[knob]

    @property
    def ids(self) -> list[str]:
        return [p["id"] for p in self.probes]

    @property
    def first(self) -> dict[str, Any]:
        return self.probes[0]

    def extra(self, key: str, default: Any = None) -> Any:
        return (self.first.get("extra") or {}).get(key, default)

    def median_extra(self, key: str) -> float | None:
        """The median of a numeric `extra` field over the pooled probes (one probe can catch an extreme moment of
        the machine); None where no probe recorded it."""
        values = [v for p in self.probes if isinstance(v := (p.get("extra") or {}).get(key), (int, float))]
        return stats.median(values) if values else None

    def _raw(self, key: str) -> list[float]:
        if key == "step_s":
            return [x for p in self.probes for x in (p.get("step_time_s") or {}).get("samples", [])]
        return [x if x is not None else math.nan for p in self.probes for x in (p.get("raw") or {}).get(key, [])]

    @cached_property
    def step_s(self) -> list[float]:
        return self._raw("step_s")

    @cached_property
    def items(self) -> list[float]:
        return self._raw("items")

    @cached_property
    def throughput(self) -> float:
        """Median items/s over the pooled window (NaN without samples)."""
        if len(self.items) != len(self.step_s):
            return math.nan
        return stats.throughput_ci(self.items, self.step_s, wave=self.wave)[0]

    @property
    def wave(self) -> int:
        return max(1, int(self.settings.get("num_workers") or 0))

    def share(self, key: str) -> float | None:
        """Share of step time spent in `key` (data_wait_s, h2d_s), pooled over the probes."""
        part, total = self._raw(key), sum(self.step_s)
        return sum(part) / total if part and total > 0 else None

    @property
    def step_median(self) -> float:
        return stats.median(self.step_s)

    @property
    def peak_memory(self) -> int | None:
        """Largest peak of the pooled probes; on CUDA the allocator's reserved peak when it is larger."""
        peaks = (footprint(p.get("peak_memory_bytes"), p.get("memory") or {}) for p in self.probes)
        return max(peaks, default=0) or None

    @property
    def allocated_peak(self) -> int | None:
        """Largest allocated peak of the pooled probes (`peak_memory_bytes`: the figure the report's cards show)."""
        return max((p.get("peak_memory_bytes") or 0 for p in self.probes), default=0) or None


@dataclass
class Gain:
    """How much faster B trains than A (B's items/s over A's), measured with a CI or estimated."""

    median: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    measured: bool = True
    basis: str = ""
    probes: list[str] = field(default_factory=list)

    @classmethod
    def estimated(cls, speedup: float | None, basis: str) -> "Gain":
        return cls(num(speedup), measured=False, basis=f"estimated: {basis}" if speedup else f"not measured: {basis}")

    @property
    def significant(self) -> bool:
        return (self.measured and self.median is not None and self.ci_low is not None
                and self.median >= 1 + SIGNIFICANT_GAIN and self.ci_low > 1.0)

    @property
    def slower(self) -> bool:
        """B is measurably slower than A."""
        return self.measured and self.ci_high is not None and self.ci_high < 1.0

    @property
    def time_saved_frac(self) -> float | None:
        """Share of the time per item that the change saves (negative when it costs time)."""
        return 1 - 1 / self.median if self.median else None

    def text(self) -> str:
        if self.median is None:
            return "an unmeasured gain"
        if self.measured and self.ci_low is not None:
            return f"{self.median:.2f}x [{self.ci_low:.2f}, {self.ci_high:.2f}]"
        return f"~{self.median:.2f}x (estimated)"

    def to_dict(self) -> dict[str, Any]:
        speedup: Any = num(self.median)
        if self.measured and speedup is not None:
            speedup = {"median": speedup, "ci_low": num(self.ci_low), "ci_high": num(self.ci_high)}
        return {"measured": self.measured and speedup is not None, "speedup": speedup,
                "time_saved_frac": num(self.time_saved_frac), "basis": self.basis}


def no_gain() -> Gain:
    return Gain(None, measured=False, basis="not a speed finding")


@dataclass
class Finding:
    """What a rule returns; the registry adds code, name and severity."""

    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # the fix as knob values
    snippet: str = ""  # the fix as code to paste
    gain: Gain = field(default_factory=no_gain)
    probes: list[str] = field(default_factory=list)


class Context:
    """One results.json document, read for rules: normalised settings, pooled configs, baseline, recommended."""

    def __init__(self, document: dict[str, Any]):
        self.document = document
        self.environment: dict[str, Any] = document.get("environment") or {}
        workload = document.get("workload") or {}
        self.facts: dict[str, Any] = workload.get("facts") or {}
        self.search: dict[str, list] = workload.get("search") or {}  # the workload's SEARCH, where it has one
        self.train_steps: int | None = workload.get("train_steps")  # --train-steps: the run compile must pay within
        self.cuda = self.environment.get("device") == "cuda"
        self.gpu: dict[str, Any] = self.environment.get("gpu") or {}
        self.probes: list[dict[str, Any]] = [
            {**p, "settings": all_settings(p.get("settings"))} for p in document.get("probes") or []]
        self.configs: dict[tuple, Config] = {}
        for p in self.probes:
            if p.get("status") == "ok" and (p.get("step_time_s") or {}).get("samples"):
                self.configs.setdefault(_key(p["settings"]), Config(p["settings"])).probes.append(p)
        self.unit = next((p["throughput"]["unit"] for p in self.probes if (p.get("throughput") or {}).get("unit")),
                         "samples/s")
        self.baseline = self._config_of(document.get("baseline"), role="baseline")
        self.recommended = self._config_of(document.get("recommended"), role=None)
        self._gains: dict[tuple, Gain] = {}

    def _config_of(self, probe: dict[str, Any] | None, role: str | None) -> Config | None:
        if probe is None and role is not None:  # a partial document: the first probe of that role
            probe = next((p for p in self.probes if p.get("role") == role), None)
        return self.config(probe["settings"]) if probe else None

    def config(self, settings: dict[str, Any]) -> Config | None:
        return self.configs.get(_key(all_settings(settings)))

    def variant(self, base: Config | None, **changes: Any) -> Config | None:
        """The measured config equal to `base` but for `changes`, or None."""
        return self.config({**base.settings, **changes}) if base is not None else None

    def series(self, base: Config | None, knob: str) -> list[Config]:
        """Measured configs equal to `base` in every knob but `knob`, sorted by that knob (base included)."""
        if base is None:
            return []
        found = [c for c in self.configs.values() if _alike(c.settings, base.settings, knob)]
        return sorted(found, key=lambda c: c[knob])

    @property
    def start(self) -> dict[str, Any]:
        """The settings a finding's code starts from: the recommended ones where there are any (a user applies
        the recommendation first, and a fix on top of it), else the baseline's."""
        subject = self.recommended or self.baseline
        return dict(subject.settings) if subject is not None else knobs.defaults()

    def applied(self, fix: dict[str, Any]) -> dict[str, Any]:
        """`fix` on top of `start`: the settings a finding's code spells out."""
        return {**self.start, **fix}

    def companions(self, subject: Config, other: Config, knob: str) -> str:
        """The settings besides `knob` (and the loader knobs that come with its workers) where `other` differs from
        `subject`, as text; '' where a comparison of `knob` at `subject` is one at `other` too."""
        if _alike(other.settings, subject.settings, knob):
            return ""
        mine, theirs = _loader_free(subject.settings), _loader_free(other.settings)
        return knobs.describe({k: v for k, v in theirs.items() if k != knob and mine.get(k) != v})

    def pairs(self, knob: str, value: Any) -> list[tuple[Config, Config]]:
        """(without, with) pairs differing only in `knob` set to `value`; pairs at the baseline first."""
        found = [(c, on) for c in self.configs.values() if c[knob] != value
                 and (on := self.variant(c, **{knob: value})) is not None]
        return sorted(found, key=lambda pair: pair[0] is not self.baseline)

    def knee(self, base: Config, knob: str) -> Config:
        """Walk `knob` upwards from `base`, keeping each value that significantly beats the best so far."""
        best = base
        for config in self.series(base, knob):
            if config[knob] > best[knob] and self.gain(best, config).significant:
                best = config
        return best

    def gain(self, a: Config, b: Config) -> Gain:
        """Throughput ratio b/a with the bootstrap CI of `analysis.stats.ratio_ci` over the raw samples; for the
        recommendation over the baseline, the confirmation's speedup: one comparison, one figure (a quick start's
        TA101 read 8.79x [7.63, 10.06] from pooled probes beside a headline of 8.11x [3.24, 13.78] for the same
        two settings)."""
        key = (tuple(a.ids), tuple(b.ids))
        confirmed = self.document.get("speedup")
        confirmed = confirmed if isinstance(confirmed, dict) else {}
        if key not in self._gains and a is self.baseline and b is self.recommended and a is not b and num(
                confirmed.get("median")) is not None:
            self._gains[key] = Gain(num(confirmed["median"]), num(confirmed.get("ci_low")),
                                    num(confirmed.get("ci_high")), measured=True,
                                    probes=[str(p) for p in confirmed.get("probes") or []] or a.ids + b.ids,
                                    basis=f"measured: the confirmation, {confirmed.get('method', '')}")
        if key not in self._gains:
            median, low, high = stats.ratio_ci(a.items, a.step_s, b.items, b.step_s, waves=(a.wave, b.wave))
            how = "95% bootstrap CI"
            if low != low and median == median:  # too few steps to resample: one measurement of the ratio
                median, low, high = stats.rounds_with_prior([median])
                how = f"95% CI of one measurement at the rounds' log spread {stats.ROUND_SPREAD:g}"
            self._gains[key] = Gain(num(median), num(low), num(high), measured=True, probes=a.ids + b.ids,
                                    basis=f"measured: {_ids(a)} -> {_ids(b)}, ratio of throughputs, {how}")
        return self._gains[key]

    def ablation_gain(self, knob: str, value: Any) -> Gain | None:
        """What `knob`=`value` contributed to the recommendation, as the planner's ablation measured it (the
        winner beside itself without the knob; planner/ablation.py), or None when it was not ablated. Rules quote
        this figure for a knob the recommendation holds, so the report states one figure per comparison."""
        c = consistency.kept_contribution(self.document, knob, value)
        if c is not None:
            return Gain(num(c["median"]), num(c["ci_low"]), num(c["ci_high"]), measured=True, probes=c["probes"],
                        basis=(f"measured: ablation {c['method']}: {knob}={value} kept beside {c['beside']}, 95% CI"
                               if c["beside"] else
                               f"measured: ablation {c['method']}: the recommendation with and without "
                               f"{knob}={value}, 95% bootstrap CI"))
        return None

    def loss_changed(self, reference: Config, candidate: Config) -> bool:
        """Whether `candidate`'s loss parted from `reference`'s beyond the parity tolerance (analysis/parity.py):
        such settings are not a speed-up to recommend (TA702, TA704 report them)."""
        found = parity.compare_probes(reference.first, candidate.first)  # at the same global steps
        return found is not None and not found.ok

    def failed(self, *statuses: str) -> list[dict[str, Any]]:
        return [p for p in self.probes if p.get("status") in statuses]

    @property
    def cpu_count(self) -> int | None:
        return self.environment.get("cpu_count")

    @property
    def usable_cores(self) -> int | None:
        """The cores the run could use (its affinity mask; older results: the machine's)."""
        return self.environment.get("usable_cores") or self.cpu_count

    def memory_capacity(self) -> tuple[int, str] | None:
        """(bytes, where the figure comes from) of the memory the probes may fill, or None when unknown."""
        budget = (self.document.get("budget") or {}).get("memory_budget_bytes")
        if budget:
            return int(budget), "the memory budget of the run"
        if self.cuda and self.gpu.get("memory_total_bytes"):
            return int(self.gpu["memory_total_bytes"]), f"{self.gpu.get('name') or 'the GPU'}'s memory"
        if not self.cuda and self.environment.get("memory_total_bytes"):
            return int(self.environment["memory_total_bytes"]), "the machine's memory"
        return None

    def judged_peak(self, config: Config) -> tuple[float | None, str | None]:
        """(`config`'s peak carried to the dataset's longest item where its probes' batches held none that long,
        how it was carried or None): `cuda_memory.judged_peak` over its pooled probes, the largest; on CUDA the
        allocator's reserved peak. (None, None) without a peak."""
        longest = (self.facts.get("extra") or {}).get("longest_item")
        found = [judged_peak(p.get("peak_memory_bytes"), p.get("memory") or {}, p.get("extra") or {}, longest)
                 for p in config.probes]
        peak, how = max(found, key=lambda f: f[0], default=(0.0, None))
        return (peak, how) if peak else (None, None)

    def memory_left(self, config: Config) -> str | None:
        """What `config`'s judged peak (`judged_peak`) leaves free of the memory capacity, as a finding says it
        ('leaves 41.3 GiB (30%) free at batch_size=256'); None where either is unknown."""
        capacity, (peak, _) = self.memory_capacity(), self.judged_peak(config)
        if capacity is None or peak is None:
            return None
        left = capacity[0] - peak
        text = (f"leaves {fmt_bytes(int(left), digits=1)} ({left / capacity[0]:.0%}) free at "
                f"batch_size={config['batch_size']}" if left > 0 else
                f"leaves nothing free at batch_size={config['batch_size']}")
        return text

    def subjects(self) -> list[Config]:
        """The configs a user runs: the baseline and the recommended one (each once)."""
        found = [self.baseline] if self.baseline is not None else []
        if self.recommended is not None and self.recommended is not self.baseline:
            found.append(self.recommended)
        return found


def _key(settings: dict[str, Any]) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in _loader_free(settings).items()))


def _loader_free(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings without loader workers hold their worker knobs at the defaults: persistent_workers or a prefetch
    depth means nothing without workers, so the baseline without workers is the recommendation's companion at
    num_workers=0 whatever the recommendation's worker knobs."""
    if settings.get("num_workers"):
        return settings
    return {**settings, **{k: knobs.KNOBS[k].default for k in knobs.LOADER_KNOBS if k in settings}}


def _alike(settings: dict[str, Any], anchor: dict[str, Any], knob: str) -> bool:
    """Whether `settings` equal `anchor` but for `knob`. For loader workers a count without workers has no worker
    knobs to match; the anchor's are its own (at the defaults where it has no workers: its ladder was walked so)."""
    anchor, settings = _loader_free(anchor), _loader_free(settings)
    skip = {knob, *knobs.LOADER_KNOBS} if knob == "num_workers" and not settings.get("num_workers") else {knob}
    return all(settings.get(k) == v for k, v in anchor.items() if k not in skip)


def _ids(config: Config) -> str:
    return "+".join(config.ids)


def changed(settings: dict[str, Any], base: dict[str, Any]) -> str:
    return knobs.describe({k: v for k, v in settings.items() if k in base}, base)


def join(values: Iterable[Any]) -> str:
    return ", ".join(str(v) for v in values)
