"""A fake probe backend: settings -> synthetic step times, so the planner is tested in milliseconds."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from tune_advisor.probe.backend import Job, ProbeLimits, bare_spec
from tune_advisor.probe.result import ProbeResult, Status
from tune_advisor.probe.spec import ProbeSpec


def fake_spec(probe_id: str, settings: dict[str, Any]) -> ProbeSpec:
    """What the fake backend reads of a spec: its id and settings."""
    return bare_spec(probe_id, settings, "", ProbeLimits())


class FakeBackend:
    """A ProbeBackend (probe/backend.py) that measures nothing.

    `rate(settings)` gives samples/s, a Status for a failing configuration, or a dict with `rate` and optionally
    `wait` (share of each step spent waiting for data), `memory` (peak bytes; default batch_size MiB), `loss`
    (the per-step losses; by default the same falling curve for every configuration, as a shared seed gives) and
    `dense` (the profile's `dense_frac`, put on a baseline probe, the one the real run profiles), `fetch_cpu`
    (`extra.fetch_cpu_frac`: the loading thread's CPU share, recorded as the child does only without workers) and
    `restart` (seconds the first measured step waits for an epoch's loader to start: `extra.epoch_start_steps`).
    Steps get seeded uniform jitter of ±`jitter` (2% by default).

    `moment(settings, role)` models the machine's speed states: the factor a probe run on its own is slowed by
    (1.0: none). Two probes measured together in lockstep (`pair`) share every moment, so it cancels between them.
    `order(settings, first)` is the factor a side of a lockstep pair is slowed by as the side that moves first
    (True) or second (False): an effect of the protocol that alternating the first mover does not cancel.

    `clock` (a FakeClock), when given, advances by each probe's wall time. `can_pair`, `pair_memory_bytes` and
    `width` are the backend's as the Session sees them; `many` hands its results back in reverse order, as a pool
    of workers finishes them in any order."""

    def __init__(self, rate: Callable[[dict[str, Any]], float | Status | dict], steps: int = 30,
                 wall_s: float = 5.0, jitter: float = 0.02,
                 moment: Callable[[dict[str, Any], str], float] | None = None, *, clock: FakeClock | None = None,
                 can_pair: bool = True, pair_memory_bytes: int | None = None, width: int = 1,
                 order: Callable[[dict[str, Any], bool], float] | None = None):
        self.rate, self.steps, self.wall_s, self.jitter = rate, steps, wall_s, jitter
        self.moment = moment or (lambda settings, role: 1.0)
        self.order = order or (lambda settings, first: 1.0)
        self.clock, self.can_pair, self.pair_memory_bytes, self.width = clock, can_pair, pair_memory_bytes, width
        self.fresh_parent_s = 0.0  # no parent process to start
        self.calls: list[dict[str, Any]] = []
        self.specs: list[ProbeSpec] = []  # every spec run, in order
        self.pairs: list[tuple[str, str]] = []  # probe ids measured together
        self.batches: list[int] = []  # how many jobs each call of `many` got
        self.closed = False

    def run(self, spec: ProbeSpec, role: str) -> ProbeResult:
        result = self._measure(spec, role, self.moment(spec.settings, role))
        self._tick(result)
        return result

    def pair(self, specs: list[ProbeSpec], roles: list[str], first: int) -> list[ProbeResult]:
        """Both in lockstep: the same moment for both, and as many steps. As probe/lockstep.py does, a side whose
        partner failed is `stopped`, with no measured step (the partner failed before its first)."""
        if not self.can_pair:
            raise NotImplementedError("this fake backend does not pair")
        self.pairs.append((specs[0].id, specs[1].id))
        results = [self._measure(s, role, slowdown=1.0 / self.order(s.settings, side == first))
                   for side, (s, role) in enumerate(zip(specs, roles))]
        failed = next((r for r in results if not r.ok), None)
        for side, result in enumerate(results):
            partner = results[1 - side]
            stopped = f"{failed.id} ended" if failed else "measured"
            result.extra["lockstep"] = {"first": side == first, "stopped": stopped, "partner": partner.id}
            if failed is not None and result.ok:
                result.extra["lockstep"]["partner_status"] = partner.status.value
                result.status, result.raw = Status.STOPPED, {k: [] for k in result.raw}
                result.error = f"stopped: its lockstep partner {partner.id} ended ({partner.status.value})"
        for result in results:
            self._tick(result)
        return results

    def many(self, jobs: list[Job]) -> Iterator[ProbeResult]:
        self.batches.append(len(jobs))
        yield from reversed([self.run(spec, role) for spec, role in jobs])

    def close(self) -> None:
        self.closed = True

    def _tick(self, result: ProbeResult) -> None:
        if self.clock is not None:
            self.clock.now += result.wall_s

    def _measure(self, spec: ProbeSpec, role: str, slowdown: float) -> ProbeResult:
        """`steps` measured steps, or as many as the protocol's max_time_s holds (the probe's wall shrinking by
        the steps cut), as a child's stop rule does."""
        probe_id, settings = spec.id, spec.settings
        self.calls.append(dict(settings))
        self.specs.append(spec)
        outcome = self.rate(settings)
        if isinstance(outcome, Status):
            return ProbeResult(probe_id, settings, outcome, error=f"fake {outcome.value}", role=role,
                               wall_s=self.wall_s)
        given = outcome if isinstance(outcome, dict) else {"rate": outcome}
        rng = np.random.default_rng(len(self.calls))
        bs = settings["batch_size"]
        times = (bs / given["rate"]) / slowdown * (1 + rng.uniform(-self.jitter, self.jitter, self.steps))
        n = max(1, int(np.searchsorted(np.cumsum(times), spec.protocol.max_time_s, side="right")))
        wall_s = max(self.wall_s - float(times[n:].sum()), float(times[:n].sum()))
        times = times[:n]
        waits = times * given.get("wait", 0.0)
        restart = given.get("restart", 0.0)
        times[0] += restart
        waits[0] += restart
        raw = {"step_s": list(times), "items": [float(bs)] * n, "data_wait_s": list(waits), "h2d_s": [0.0] * n,
               "loss": list(given.get("loss", [2.0 - 0.01 * i for i in range(self.steps)]))[:n]}
        result = ProbeResult(probe_id, settings, Status.OK, raw=raw, role=role, wall_s=wall_s,
                             peak_memory_bytes=given.get("memory", bs * 2**20))
        if "dense" in given and role == "baseline":
            result.extra["profile"] = {"dense_frac": given["dense"]}
        if "fetch_cpu" in given and settings["num_workers"] == 0:
            result.extra["fetch_cpu_frac"] = given["fetch_cpu"]
        if restart:
            result.extra["epoch_start_steps"] = [0]
        return result


class FakeClock:
    """The time a Session reads: a FakeBackend given it advances it by each probe's wall time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- fake hardware: what hardware.native_types reads (`cpu_info`: /proc/cpuinfo's text; `cuda_props`) ---------------


def fake_cpuinfo(*flags: str, arm: bool = False) -> str:
    """/proc/cpuinfo of a two-core machine listing these x86 `flags` (or, `arm`, these `Features`)."""
    key, model = ("Features", "CPU implementer\t: 0x41") if arm else ("flags", "model name\t: Fake CPU")
    return "\n".join(f"processor\t: {i}\n{model}\n{key}\t\t: {' '.join(flags)}\n" for i in range(2))


ZEN3_CPUINFO = fake_cpuinfo("fpu", "sse4_2", "avx", "avx2", "fma")  # AVX2 only: bf16 is emulated
AVX512_BF16_CPUINFO = fake_cpuinfo("avx2", "avx512f", "avx512_bf16")  # Zen 4/5, Cooper Lake
AMX_CPUINFO = fake_cpuinfo("avx2", "avx512f", "amx_tile", "amx_bf16")  # Sapphire Rapids (without avx512_bf16 here)
GRAVITON3_CPUINFO = fake_cpuinfo("fp", "asimd", "asimdhp", "sve", "bf16", arm=True)
GRAVITON2_CPUINFO = fake_cpuinfo("fp", "asimd", "asimdhp", arm=True)  # Neoverse N1: no bf16
UNKNOWN_CPUINFO = ""  # no /proc/cpuinfo (macOS, Windows), or one without flags


class FakeCudaProps:
    """The fields of torch.cuda.get_device_properties that the native-type detection reads."""

    def __init__(self, name: str, major: int, minor: int):
        self.name, self.major, self.minor = name, major, minor


TURING_T4 = FakeCudaProps("Tesla T4", 7, 5)
AMPERE_A100 = FakeCudaProps("NVIDIA A100-SXM4-40GB", 8, 0)


class StopAfter:
    """A frameworks.LoopProbe that stops the framework's own loop after `steps` steps and keeps what it was told:
    `started` (cycle, batches per step, the loader), the losses of the steps, the optimizers it rebuilt."""

    def __init__(self, steps: int):
        self.steps, self.losses, self.started_with, self.rebuilt = steps, [], None, []

    def started(self, loader, cycle: int, per_step: int = 1) -> None:
        self.started_with = (cycle, per_step, loader)

    def step_ended(self, loss) -> bool:
        self.losses.append(loss)
        return len(self.losses) >= self.steps

    def optimizer_impl(self, optimizer):
        self.rebuilt.append(optimizer)
        return optimizer

    def prepare_model(self, model) -> dict:
        return {}
