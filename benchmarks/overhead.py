"""What do the collectors cost the timed steps? (SPEC §4: instrumentation stays far inside the 5% fidelity bar.)

Three measurements. Shared VMs switch between speed states ~30% apart that last seconds, so comparing two runs
of a few seconds each measures the machine, not the sampler. Parts 1 and 2 therefore toggle the sampler on and off
in short slices (a quarter of a second, or ten steps) within ONE training loop, and compare each "on" slice with
the "off" slice next to it: the median of those paired ratios, with a bootstrap 95% CI over pairs.

1. NVML sampler: a training loop in this process with the `NvmlSampler` thread at its real rate (15 Hz) started
   and stopped slice by slice. Without a GPU here the sampler reads a fake pynvml (pure Python, so it holds the
   GIL longer than real NVML's ctypes calls, which release it): the thread's wake-ups and bookkeeping are what is
   measured. Also the duty cycle: the cost of one sample times the rate.
2. Memory sampler: a training child (benchmarks/hand_loop.py, recording each step's end on the monotonic clock)
   whose process tree the parent's `TreeMemorySampler` watches in alternate slices; steps are assigned to slices
   by time. And its duty cycle.
3. Profiler: probes with and without `profile=True`. The profiler's extra steps run after the measured ones, so
   the measured throughput must agree, and the measured step count is the protocol's, not five more.

    python benchmarks/overhead.py [--rounds N]     # N x 8 slice pairs in parts 1-2, N probe rounds in part 3
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from tune_advisor import api
from tune_advisor.collectors.memory import INTERVAL_S as MEMORY_INTERVAL_S, TreeMemorySampler
from tune_advisor.collectors.nvml import INTERVAL_S as NVML_INTERVAL_S, NvmlSampler
from tune_advisor.probe.spec import Protocol

ROOT = Path(__file__).resolve().parents[1]
# Host-bound (sub-millisecond steps, where a thread's wake-ups would show most) and compute-bound (~45 ms).
LOOP_WORKLOADS = [ROOT / "tests" / "workloads" / "tiny_mlp.py", ROOT / "fixtures" / "tiny_batch_mlp.py"]
MIN_SLICE_S = 0.25  # a slice lasts this long, or ten steps when steps are longer
PAIRS = 40  # on/off slice pairs per workload (--rounds N sets N x 8)
median_step_s: dict[str, float] = {}  # from part 1, to size the hand loops of part 2
PROBE_PROTOCOL = Protocol(warmup_steps=3, min_steps=20, min_time_s=2.0, max_time_s=10.0)


class FakeNvml:
    """pynvml's sampling calls, answering constants."""

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(gpu=97, memory=40)
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(used=30 * 2**30, total=80 * 2**30)
    def nvmlDeviceGetPowerUsage(self, h): return 412_000
    def nvmlDeviceGetClockInfo(self, h, kind): return 1755
    def nvmlDeviceGetMaxClockInfo(self, h, kind): return 1980
    def nvmlDeviceGetTemperature(self, h, sensor): return 61
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return 0


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"wl_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.2f}%"


def paired(ratios: list[float]) -> str:
    """Median of the paired on/off step-time ratios as a percentage change, with a bootstrap 95% CI over pairs."""
    r = np.log(np.asarray(ratios))
    rng = np.random.default_rng(0)
    boot = np.median(r[rng.integers(0, r.size, (4000, r.size))], axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    return (f"{(np.exp(np.median(r)) - 1) * 100:+.2f}% [{(np.exp(low) - 1) * 100:+.2f}%, "
            f"{(np.exp(high) - 1) * 100:+.2f}%] over {r.size} pairs")


# --- 1. NVML sampler thread ------------------------------------------------------------------------------------


def nvml_thread_cost(pairs: int) -> list[str]:
    lines = []
    idle = NvmlSampler("cuda", interval_s=3600, nvml=FakeNvml())  # its thread samples once, then sleeps
    idle.start()
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        idle.sample()
    per_sample = (time.perf_counter() - t0) / n
    idle.stop()
    rate = 1 / NVML_INTERVAL_S
    lines.append(f"NVML sampler duty cycle: {per_sample * 1e6:.1f} us per sample (fake pynvml) x {rate:.0f} Hz = "
                 f"{per_sample * rate * 100:.3f}% of one core")
    absent = NvmlSampler("cuda")
    absent.start()
    absent.stop()
    lines.append(f"NVML on this machine: {absent.status} -> no thread is started")

    for path in LOOP_WORKLOADS:
        name = path.name
        wl = load(path)
        torch.manual_seed(0)
        model = wl.build_model().train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = DataLoader(wl.build_dataset(), batch_size=wl.BASELINE["batch_size"], shuffle=True)
        batches = iter(loader)

        def step():
            nonlocal batches
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            t = time.perf_counter()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return time.perf_counter() - t

        warm = [step() for _ in range(5)]
        slice_s = max(MIN_SLICE_S, 10 * statistics.median(warm))
        ratios, counts, sampled = [], [0, 0], 0
        for i in range(pairs):
            means = {}
            for variant in (("without", "with") if i % 2 == 0 else ("with", "without")):  # ABBA: no first-mover
                sampler = NvmlSampler("cuda", nvml=FakeNvml()) if variant == "with" else None
                if sampler:
                    sampler.start()
                times, start = [], time.perf_counter()
                while time.perf_counter() - start < slice_s:
                    times.append(step())
                if sampler:
                    sampler.stop()
                    assert sampler.status == "ok"
                    sampled += len(sampler.samples)
                means[variant] = statistics.mean(times)
                counts[variant == "with"] += len(times)
            ratios.append(means["with"] / means["without"])
        median_step_s[name] = statistics.median(warm)
        lines.append(f"  {name:<18} mean step time with the NVML thread vs without: {paired(ratios)} "
                     f"({slice_s * 1e3:.0f} ms slices; {counts[0]} / {counts[1]} steps; {sampled} NVML samples)")
    return lines


# --- 2. memory sampler -----------------------------------------------------------------------------------------


def watched_in_slices(path: Path, pairs: int) -> tuple[list[float], float]:
    """One hand-loop child, its tree watched by the memory sampler in alternate slices; returns the paired
    watched/unwatched step-time ratios and the slice length."""
    step_s = median_step_s.get(path.name, 0.05)
    slice_s = max(MIN_SLICE_S, 10 * step_s)
    settings = {"batch_size": load(path).BASELINE["batch_size"], "num_workers": 0, "channels_last": False,
                "amp": "off"}
    steps = int((2 * pairs + 6) * slice_s / step_s)  # enough for every slice, with slack for slow steps
    with tempfile.TemporaryDirectory() as tmp:
        times_path = Path(tmp) / "steps.json"
        proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "hand_loop.py"), str(path),
                                 json.dumps(settings), str(steps), str(times_path)], stdout=subprocess.PIPE,
                                text=True)
        time.sleep(3 * slice_s + 2.0)  # start-up and warm-up: no slice yet
        slices = []
        while proc.poll() is None and len(slices) < 2 * pairs:
            watched = (len(slices) % 4) in (1, 2)  # off, on, on, off, ...: ABBA
            sampler = TreeMemorySampler(proc.pid) if watched else None
            if sampler:
                sampler.start()
            begin = time.monotonic()
            time.sleep(slice_s)
            if sampler:
                sampler.stop()
            slices.append((begin, time.monotonic(), watched))
        proc.communicate()
        ends = json.loads(times_path.read_text())
    # Step durations from consecutive end times; a step belongs to the slice its end falls in.
    mean_in = []
    for begin, end, watched in slices:
        durations = [b - a for (a, _), (b, _) in zip(ends, ends[1:]) if begin <= b < end]
        mean_in.append((statistics.mean(durations) if durations else None, watched))
    ratios = []
    for i in range(0, len(mean_in) - 1, 2):
        (a, wa), (b, wb) = mean_in[i], mean_in[i + 1]
        if a and b and wa != wb:
            ratios.append((a if wa else b) / (b if wa else a))
    return ratios, slice_s


def memory_sampler_cost(pairs: int) -> list[str]:
    sampler = TreeMemorySampler(os.getpid())
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        sampler.sample()
    per_sample = (time.perf_counter() - t0) / n
    rate = 1 / MEMORY_INTERVAL_S
    lines = [f"memory sampler duty cycle: {per_sample * 1e6:.1f} us per sample x {rate:.0f} Hz = "
             f"{per_sample * rate * 100:.4f}% of one core"]
    for path in LOOP_WORKLOADS:
        ratios, slice_s = watched_in_slices(path, pairs)
        lines.append(f"  {path.name:<18} hand-loop child, mean step time watched by the memory sampler vs not: "
                     f"{paired(ratios)} ({slice_s * 1e3:.0f} ms slices)")
    return lines


# --- 3. profiler outside the timing ----------------------------------------------------------------------------


def profiler_exclusion(rounds: int) -> list[str]:
    lines = []
    workdir = Path(tempfile.mkdtemp(prefix="overhead-"))
    for path in LOOP_WORKLOADS:
        name = path.name
        results = {False: [], True: []}
        for _ in range(min(rounds, 3)):  # probes take seconds each
            for profile in (False, True):
                _, r = api.probe(path, {}, device="cpu", protocol=PROBE_PROTOCOL, workdir=workdir,
                                 profile=profile)
                assert r.ok, r.error
                assert len(r.step_s) == len(r.items) == len(r.raw["loss"])
                results[profile].append(r)
        plain, profiled = (statistics.median(x.throughput()[0] for x in results[p]) for p in (False, True))
        steps = [len(r.step_s) for r in results[True]]
        prof = [r.extra["profile"] for r in results[True]]
        prof_step = statistics.median(p["step_time_s"] for p in prof)
        measured_step = statistics.median(statistics.median(r.step_s) for r in results[True])
        lines.append(f"  {name:<18} probe {plain:9.1f} samples/s without, {profiled:9.1f} with --profile "
                     f"({pct(profiled, plain)}); measured steps with profile: {steps} (protocol's, the 5 "
                     f"profiler steps not among them); profiled step {prof_step * 1e3:.2f} ms vs measured "
                     f"{measured_step * 1e3:.2f} ms (not in the timing); trace "
                     f"{prof[-1]['trace']['bytes'] / 1024:.0f} KiB")
    return lines


def main(argv: list[str]) -> int:
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else PAIRS // 8
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {torch.get_num_threads()} threads; {rounds * 8} "
          f"on/off slice pairs (parts 1, 2), {min(rounds, 3)} probe rounds (part 3)", flush=True)
    for title, fn, n in (("1. NVML sampler thread", nvml_thread_cost, rounds * 8),
                         ("2. memory sampler (parent side)", memory_sampler_cost, rounds * 8),
                         ("3. profiler runs after the measured steps", profiler_exclusion, rounds)):
        print(f"\n{title}", flush=True)
        for line in fn(n):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
