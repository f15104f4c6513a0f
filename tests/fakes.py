"""A fake probe backend: settings -> synthetic step times, so the planner is tested in milliseconds."""

from __future__ import annotations

from types import SimpleNamespace
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
    `dense` and `optimizer` (the profile's `dense_frac` and `optimizer_frac`, put on a baseline probe, the one the
    real run profiles), `fetch_cpu`
    (`extra.fetch_cpu_frac`: the loading thread's CPU share, recorded as the child does only without workers) and
    `restart` (seconds the first measured step waits for an epoch's loader to start: `extra.epoch_start_steps`),
    `shutdown` (seconds that step spends outside its data wait, as the old workers shut down), `compile_s`,
    `graphs` and `unsupported` (a compiled probe's `extra.compile`).
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
        restart, shutdown = given.get("restart", 0.0), given.get("shutdown", 0.0)
        times[0] += restart + shutdown
        waits[0] += restart
        raw = {"step_s": list(times), "items": [float(bs)] * n, "data_wait_s": list(waits), "h2d_s": [0.0] * n,
               "loss": list(given.get("loss", [2.0 - 0.01 * i for i in range(self.steps)]))[:n]}
        result = ProbeResult(probe_id, settings, Status.OK, raw=raw, role=role, wall_s=wall_s,
                             peak_memory_bytes=given.get("memory", bs * 2**20))
        if ("dense" in given or "optimizer" in given) and role == "baseline":
            result.extra["profile"] = {"dense_frac": given.get("dense"), "optimizer_frac": given.get("optimizer")}
        if "compile_s" in given and settings.get("compile", "off") != "off":  # what its warm-up spent compiling
            result.extra["compile"] = {"compile_s": given["compile_s"]}
            result.wall_s += given["compile_s"]
            if "graphs" in given:  # what dynamo compiled (0: it gave up, for `unsupported`)
                result.extra["compile"].update(graphs=given["graphs"], unsupported=given.get("unsupported", []))
        if "fetch_cpu" in given and settings["num_workers"] == 0:
            result.extra["fetch_cpu_frac"] = given["fetch_cpu"]
        if restart or shutdown:
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


# --- fake NVML with an energy counter (collectors/nvml.py, the measured window's energy) ------------------------------


class FakeNvmlError(Exception):
    """pynvml's NVMLError: its text is what the collector reads ("Not Supported", "GPU is lost")."""


class FakeEnergyNvml:
    """The slice of pynvml that the sampler and the window's energy read use, for one GPU drawing `watts`: its
    energy counter (millijoules since the driver loaded, from `start_mj`) advances with the fake's own time, moved by
    `advance(seconds)`. `energy`: "ok", "unsupported" (a pre-Volta GPU: NVMLError_NotSupported), "missing" (an old
    pynvml without the call), "reset" (the counter restarts after the first read: a driver reload), "stuck" (it
    never moves) or "lost" (the GPU fell off the bus)."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVMLError = FakeNvmlError

    def __init__(self, watts: float = 250.0, start_mj: int = 7_000_000, energy: str = "ok"):
        self.watts, self.start_mj, self.energy, self.now = watts, start_mj, energy, 0.0
        self.energy_reads = 0
        if energy == "missing":
            self.nvmlDeviceGetTotalEnergyConsumption = None  # as an old pynvml, which has no such call

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.energy_reads += 1
        if self.energy == "unsupported":
            raise FakeNvmlError("Not Supported")
        if self.energy == "lost":
            raise FakeNvmlError("GPU is lost")
        if self.energy == "stuck":
            return self.start_mj
        base = 0 if self.energy == "reset" and self.energy_reads > 1 else self.start_mj
        return base + round(self.watts * self.now * 1000)

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        raise FakeNvmlError("Not Found")

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=90, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=2**30, total=16 * 2**30, free=15 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle):
        return round(self.watts * 1000)  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return 1410

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1410

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 60

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 0


# --- a fake CUDA timeline: torch.cuda as probe/device_clock.py uses it, over a simulated host and GPU -----------------


class FakeGpu:
    """One GPU and the wall clock of the processes that share it, in ms. The GPU runs the work queued to it in the
    order it was queued, one piece at a time, whichever process queued it (two processes' kernels share a GPU by time
    slices: how long both take together is what matters here). One host runs at a time, as lockstep sides do."""

    def __init__(self):
        self.host_ms = 0.0  # the wall clock: where the running host is
        self.free_ms = 0.0  # when the GPU will have run everything queued so far


class FakeEvent:
    """torch.cuda.Event on a FakeCuda's stream: `record` marks the stream's position (an idle stream reaches it at
    once), the event completes when the GPU gets there (so events complete in stream order), and `elapsed_time`
    is the ms between two completed, timed events, raising as CUDA does on one not yet complete."""

    def __init__(self, cuda: FakeCuda, enable_timing: bool):
        self.cuda, self.timing, self.at = cuda, enable_timing, None

    def record(self) -> None:
        self.at = max(self.cuda.stream_ms, self.cuda.gpu.host_ms)

    def query(self) -> bool:
        return self.at is None or self.cuda.gpu.host_ms >= self.at

    def synchronize(self) -> None:
        """The host waits for this event alone (not the whole device)."""
        self.cuda.event_waits += 1
        if self.at is not None:
            self.cuda.gpu.host_ms = max(self.cuda.gpu.host_ms, self.at)

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.timing and end.timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.at is None or end.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")
        return end.at - self.at


class FakeTensor:
    """A loss on the GPU: its value is there once the stream has run the work queued before it; `.item()` waits."""

    def __init__(self, cuda: FakeCuda, value: float):
        self.cuda, self.value, self.ready_ms = cuda, value, cuda.stream_ms

    def detach(self) -> FakeTensor:
        return self

    def float(self) -> FakeTensor:
        return self

    def item(self) -> float:
        self.cuda.gpu.host_ms = max(self.cuda.gpu.host_ms, self.ready_ms)
        return self.value


class FakeCuda:
    """torch.cuda of one process on a FakeGpu (its own by default): one stream, `Event`, `synchronize()`, and the
    work a training loop queues: `host(ms)` (the host's own work: fetching a batch), `kernel(ms)`, `copy(ms,
    pinned, non_blocking)` and `loss(value)`. A kernel or copy starts once the stream and the GPU are free and the
    host has queued it. A copy returns to the host at once only from pinned memory with non_blocking=True; from
    pageable memory (or without non_blocking) the host waits for it, the driver staging it through a pinned buffer.
    `synchronize()` waits for everything this process queued, as torch.cuda.synchronize does."""

    def __init__(self, gpu: FakeGpu | None = None):
        self.gpu = gpu or FakeGpu()
        self.stream_ms = 0.0  # when this process's stream will have run what it queued
        self.device_syncs = 0  # synchronize() calls
        self.event_waits = 0  # Event.synchronize() calls

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 — torch.cuda's name
        return FakeEvent(self, enable_timing)

    def synchronize(self) -> None:
        self.device_syncs += 1
        self.gpu.host_ms = max(self.gpu.host_ms, self.stream_ms)

    def host(self, ms: float) -> None:
        self.gpu.host_ms += ms

    def kernel(self, ms: float) -> None:
        self._queue(ms)

    def copy(self, ms: float, pinned: bool, non_blocking: bool) -> None:
        done = self._queue(ms)
        if not (pinned and non_blocking):
            self.gpu.host_ms = done

    def loss(self, value: float) -> FakeTensor:
        return FakeTensor(self, value)

    def _queue(self, ms: float) -> float:
        gpu = self.gpu
        self.stream_ms = gpu.free_ms = max(self.stream_ms, gpu.free_ms, gpu.host_ms) + ms
        return self.stream_ms


class FakeLoop:
    """probe/training.py Training.step's calls on a step clock (device_clock), over a FakeCuda: each step the host
    fetches a batch (`fetch_ms`), copies it to the GPU (`copy_ms`; from pinned memory when `pinned`, with
    non_blocking=True where pinned unless `non_blocking` says otherwise), queues `compute_ms` of kernels and ends
    the step. `steps` holds what the clock reported finished, `host_copy_ms` the host's time in each copy call."""

    def __init__(self, cuda: FakeCuda, clock, fetch_ms: float, copy_ms: float, compute_ms: float, pinned: bool,
                 non_blocking: bool | None = None):
        self.cuda, self.clock, self.pinned = cuda, clock, pinned
        self.non_blocking = pinned if non_blocking is None else non_blocking  # as probe/apply.py copies
        self.fetch_ms, self.copy_ms, self.compute_ms = fetch_ms, copy_ms, compute_ms
        self.steps: list = []
        self.host_copy_ms: list[float] = []
        self.next = 0

    def step(self, drain: bool = False) -> list:
        """One step (`drain`: a lockstep turn's last, waited for); returns the steps the clock finished now."""
        cuda, clock = self.cuda, self.clock
        clock.begin()
        cuda.host(self.fetch_ms)
        clock.copy_start()
        before = cuda.gpu.host_ms
        cuda.copy(self.copy_ms, self.pinned, self.non_blocking)
        self.host_copy_ms.append(cuda.gpu.host_ms - before)
        clock.copy_end()
        cuda.kernel(self.compute_ms)
        done = clock.end(self.next, cuda.loss(1.0), t0=0.0, sync=drain)
        self.next += 1
        self.steps += done
        return done

    def run(self, steps: int) -> list:
        for _ in range(steps):
            self.step()
        self.steps += self.clock.flush()
        return self.steps


# --- a fake CUDA caching allocator: what torch.cuda's memory statistics read (probe.evidence.memory_peaks) ---------


class FakeCudaOOM(RuntimeError):
    """What torch raises when the allocator cannot reserve a block (torch.cuda.OutOfMemoryError)."""


class FakeCudaAllocator:
    """torch's CUDA caching allocator as its statistics show it, for `total_bytes` of GPU memory. A request is
    rounded up to whole 2 MiB blocks; a freed block stays reserved (cached) for a later request it can hold, served
    whole (torch would split a large block; this fake does not, which only adds to the reserve); a request that no
    cached block holds reserves a new one; past the GPU's memory the cache is emptied and the request retried, as
    torch does, before it raises FakeCudaOOM. So where the sizes a step asks for grow from step to step (a longer
    padded sequence), the blocks cached for the shorter ones cannot serve them and reserved exceeds allocated."""

    BLOCK = 2 * 2**20

    def __init__(self, total_bytes: int):
        self.total = total_bytes
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.cached: list[int] = []

    def malloc(self, size: int) -> tuple[int, int]:
        """A block for `size` bytes: (the block's size, the bytes allocated in it)."""
        size = -(-size // self.BLOCK) * self.BLOCK
        block = min((b for b in self.cached if b >= size), default=None)
        if block is not None:
            self.cached.remove(block)
        else:
            if self.reserved + size > self.total:  # torch frees its cached blocks and retries before failing
                self.reserved -= sum(self.cached)
                self.cached.clear()
            if self.reserved + size > self.total:
                raise FakeCudaOOM(f"CUDA out of memory. Tried to allocate {size / 2**20:.0f} MiB")
            block, self.reserved = size, self.reserved + size
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block, size

    def free(self, handle: tuple[int, int]) -> None:
        block, size = handle
        self.allocated -= size
        self.cached.append(block)

    def train(self, weights_bytes: int, batch_size: int, lengths: list[int], bytes_per_element: int,
              layers: int = 4) -> None:
        """Weights and optimizer state held throughout, then a step per length in `lengths` (each batch padded to
        that length): every layer's activations (batch x length x `bytes_per_element`) held until backward."""
        self.malloc(weights_bytes)
        for length in lengths:
            activations = [self.malloc(batch_size * length * bytes_per_element) for _ in range(layers)]
            for handle in reversed(activations):
                self.free(handle)

    # torch.cuda's statistics, by their names
    def max_memory_allocated(self, device=None) -> int:
        return self.peak_allocated

    def max_memory_reserved(self, device=None) -> int:
        return self.peak_reserved


class FakeCudaBackend(FakeBackend):
    """A FakeBackend whose probes each run a new FakeCudaAllocator of `total_bytes` through their steps (a probe is
    a new process): `lengths(settings)` gives each step's padded input length, each of `layers` layers holding
    batch x length x `bytes_per_element` of activations beside `weights_bytes`. A probe records what the child
    records (`memory` as probe.evidence.memory_peaks writes it, `extra.largest_input` as StepSeries does) and
    `peak_memory_bytes` the allocated peak, as probe.runner.peak_memory takes it on CUDA; it ends `oom` where the
    allocator ran out. `reserved=False` drops the reserved peak: what a judge of allocated peaks alone sees."""

    def __init__(self, rate, total_bytes: int, lengths: Callable[[dict[str, Any]], list[int]],
                 bytes_per_element: int, weights_bytes: int = 2**30, layers: int = 4, reserved: bool = True,
                 **kwargs):
        super().__init__(rate, **kwargs)
        self.total_bytes, self.lengths, self.bytes_per_element = total_bytes, lengths, bytes_per_element
        self.weights_bytes, self.layers, self.reserved = weights_bytes, layers, reserved

    def _measure(self, spec: ProbeSpec, role: str, slowdown: float) -> ProbeResult:
        result = super()._measure(spec, role, slowdown)
        if not result.ok:
            return result
        allocator, lengths = FakeCudaAllocator(self.total_bytes), self.lengths(spec.settings)
        try:
            allocator.train(self.weights_bytes, spec.settings["batch_size"], lengths, self.bytes_per_element,
                            self.layers)
        except FakeCudaOOM as exc:
            return ProbeResult(spec.id, spec.settings, Status.OOM, error=f"oom: {exc}", role=role,
                               wall_s=result.wall_s)
        result.memory = {"cuda_max_allocated_bytes": allocator.max_memory_allocated(),
                         **({"cuda_max_reserved_bytes": allocator.max_memory_reserved()} if self.reserved else {})}
        result.peak_memory_bytes = allocator.max_memory_allocated()
        result.extra["largest_input"] = max(lengths)
        result.extra["input_shapes_static"] = len(set(lengths)) <= 1
        return result


class TimelineBackend(FakeBackend):
    """A FakeBackend whose probes run on a fake CUDA timeline: `timeline(settings)` gives the FakeLoop's (fetch_ms,
    copy_ms, compute_ms, non_blocking) for those settings (pinned where settings say pin_memory), and each probe's
    rate, host-to-device share and `extra.h2d` overlap are what device_clock's event clock reads of 20 such steps.
    `step_clock` is the clock its results say timed them: device_clock.DEVICE, or HOST_SYNCED for a loop that waits
    for the GPU every step, as a framework's own loop does (its steps then run one at a time on the timeline)."""

    def __init__(self, timeline: Callable[[dict[str, Any]], tuple], step_clock: str = "cuda events", **kwargs):
        self.timeline, self.step_clock = timeline, step_clock
        super().__init__(lambda settings: self.measured(settings)["rate"], **kwargs)

    def measured(self, settings: dict[str, Any]) -> dict[str, Any]:
        from tune_advisor.probe import device_clock

        fetch_ms, copy_ms, compute_ms, non_blocking = self.timeline(settings)
        cuda = FakeCuda()
        synced = self.step_clock != device_clock.DEVICE  # each step over before the next: timed from its start
        clock = device_clock.CudaEventClock(cuda, lag=0, paced=True) if synced else device_clock.CudaEventClock(cuda)
        loop = FakeLoop(cuda, clock, fetch_ms, copy_ms, compute_ms, bool(settings["pin_memory"]), non_blocking)
        for _ in range(20):
            loop.step(drain=synced)
        steps = loop.steps + clock.flush()
        step_s = sum(s.seconds for s in steps) / len(steps)
        host_copy_s = [ms / 1000 for ms in loop.host_copy_ms]
        return {"rate": settings["batch_size"] / step_s, "h2d_frac": sum(host_copy_s) / len(steps) / step_s,
                "h2d": device_clock.overlap(host_copy_s, [s.copy_s for s in steps])}

    def _measure(self, spec: ProbeSpec, role: str, slowdown: float) -> ProbeResult:
        from tune_advisor.probe import device_clock

        result = super()._measure(spec, role, slowdown)
        if result.ok:
            seen = self.measured(spec.settings)
            result.raw["h2d_s"] = [s * seen["h2d_frac"] for s in result.raw["step_s"]]
            result.extra["step_clock"] = self.step_clock
            if self.step_clock == device_clock.DEVICE:
                result.extra["h2d"] = {**seen["h2d"], "non_blocking": bool(spec.settings["pin_memory"]),
                                       "clock": "cuda events"}
        return result
