"""What do the collectors cost the timed steps? (SPEC §4: instrumentation stays far inside the 5% fidelity bar.)

Three measurements, each alternating the variants (A B A B ...) in one run so machine drift hits both alike:

1. NVML sampler: a training loop in this process with and without an `NvmlSampler` thread at its real rate
   (15 Hz). Without a GPU here the sampler reads a fake pynvml (pure Python, so it holds the GIL longer than
   real NVML's ctypes calls, which release it): the thread's wake-ups and bookkeeping are what is measured.
   Also the duty cycle: the cost of one sample times the rate.
2. Memory sampler: the parent's `TreeMemorySampler` watching a training child (benchmarks/hand_loop.py) against
   the same child unwatched; and its duty cycle.
3. Profiler: probes with and without `profile=True`. The profiler's extra steps run after the measured ones, so
   the measured throughput must agree, and the measured step count is the protocol's, not five more.

    python benchmarks/overhead.py [--rounds N]
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
SECONDS_PER_SLICE = 2.0
HAND_LOOP_SECONDS = 3.0
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


# --- 1. NVML sampler thread ------------------------------------------------------------------------------------


def nvml_thread_cost(rounds: int) -> list[str]:
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

        for _ in range(5):
            step()  # warm-up
        times = {"without": [], "with": []}
        for _ in range(rounds):
            for variant in ("without", "with"):
                sampler = NvmlSampler("cuda", nvml=FakeNvml()) if variant == "with" else None
                if sampler:
                    sampler.start()
                start = time.perf_counter()
                while time.perf_counter() - start < SECONDS_PER_SLICE:
                    times[variant].append(step())
                if sampler:
                    sampler.stop()
                    assert sampler.status == "ok" and sampler.samples
        a, b = statistics.median(times["without"]), statistics.median(times["with"])
        median_step_s[name] = a
        lines.append(f"  {name:<18} median step {a * 1e3:8.3f} ms without, {b * 1e3:8.3f} ms with the NVML thread "
                     f"({pct(b, a)}; {len(times['without'])} / {len(times['with'])} steps)")
    return lines


# --- 2. memory sampler -----------------------------------------------------------------------------------------


def hand_loop(path: Path, watched: bool) -> float:
    settings = {"batch_size": load(path).BASELINE["batch_size"], "num_workers": 0, "channels_last": False,
                "amp": "off"}
    steps = max(10, int(HAND_LOOP_SECONDS / median_step_s.get(path.name, 0.05)))
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "hand_loop.py"), str(path),
                             json.dumps(settings), str(steps)], stdout=subprocess.PIPE, text=True)
    sampler = TreeMemorySampler(proc.pid) if watched else None
    if sampler:
        sampler.start()
    output, _ = proc.communicate()
    if sampler:
        sampler.stop()
    return json.loads(output.strip().splitlines()[-1])["items_per_s"]


def memory_sampler_cost(rounds: int) -> list[str]:
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
        name = path.name
        rates = {"unwatched": [], "watched": []}
        for _ in range(rounds):
            for variant in rates:
                rates[variant].append(hand_loop(path, variant == "watched"))
        a, b = statistics.median(rates["unwatched"]), statistics.median(rates["watched"])
        lines.append(f"  {name:<18} hand loop {a:9.1f} samples/s unwatched, {b:9.1f} watched by the memory "
                     f"sampler ({pct(b, a)} throughput)")
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
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 3
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, {rounds} rounds "
          "(variants alternated)", flush=True)
    for title, fn in (("1. NVML sampler thread", nvml_thread_cost), ("2. memory sampler (parent side)",
                                                                     memory_sampler_cost),
                      ("3. profiler runs after the measured steps", profiler_exclusion)):
        print(f"\n{title}", flush=True)
        for line in fn(rounds):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
