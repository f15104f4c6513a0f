"""The probe child's measuring core (probe/measure.py), which the workload-file trainer and script mode share: when
warm-up is over, the measured window's clock, and what the record says of the window."""

from __future__ import annotations

import gc
import math
import subprocess
import sys
import time

import pytest

from tune_advisor.probe.measure import COMPILE_EXTRA_WARMUP, Measurement, Spent, WarmUp, Window


class FakeCompile:
    """Dynamo's graph count, as CompileStats reports it: `graphs_after[n]` after n steps."""

    def __init__(self, graphs_after):
        self.graphs_after, self.steps, self.marks = graphs_after, 0, []

    def graphs(self) -> int:
        return self.graphs_after[min(self.steps, len(self.graphs_after) - 1)]

    def mark(self, name: str) -> None:
        self.marks.append(name)


def warm_up(warm: WarmUp, compile_stats: FakeCompile | None = None) -> int:
    """Steps until `warm` says warm-up is over."""
    steps = 0
    while not warm.over(steps):
        steps += 1
        if compile_stats:
            compile_stats.steps = steps
    return steps


def test_warm_up_drains_the_loaders_backlog_and_ends_on_a_whole_cycle():
    # GIVEN 3 protocol steps, 2 workers prefetching 2 batches each, and an optimizer step every 3 batches
    assert warm_up(WarmUp(3, workers=2, prefetch=2, compile_stats=None, cycle=3)) == 6  # 4 batches, whole cycles
    assert warm_up(WarmUp(0, workers=0, prefetch=2, compile_stats=None, minimum=1)) == 1


def test_a_compiled_model_warms_up_until_three_steps_in_a_row_compiled_nothing():
    # GIVEN a model that compiles a new graph after steps 1, 2 and 4 (new shapes), then settles
    compile_stats = FakeCompile([0, 1, 2, 2, 3, 3, 3, 3, 3, 3, 3])
    warm = WarmUp(2, 0, 0, compile_stats, cycle=2)
    # THEN steps 5, 6 and 7 compiled nothing: settled after 7, and one more for a whole cycle
    assert warm_up(warm, compile_stats) == 8


def test_shapes_that_never_settle_end_the_warm_up_after_the_extra_steps():
    compile_stats = FakeCompile(list(range(100)))
    assert warm_up(WarmUp(3, 0, 0, compile_stats), compile_stats) == 3 + COMPILE_EXTRA_WARMUP


def test_warm_up_is_written_at_once_and_marks_the_compile_counters():
    compile_stats = FakeCompile([0])
    warm = WarmUp(1, 0, 0, compile_stats)
    warm.step_s.extend([0.5, 0.1])
    extra = {}
    warm.done(extra, 2, 0.7)
    assert extra == {"warmup_s": 0.7, "warmup_steps": 2, "warmup_step_s": [0.5, 0.1]}
    assert compile_stats.marks == ["warmup"]


def test_the_window_counts_the_fetches_between_its_opening_and_closing_and_closes_once():
    # GIVEN a loader whose running fetch totals grow before, during and after the window
    totals = {"wall": 1.0, "cpu": 0.5}
    window = Window("cpu", lambda: (totals["wall"], totals["cpu"]))
    window.close()  # never opened: nothing to close
    assert window.spent is None
    window.open()
    totals.update(wall=3.0, cpu=1.5)
    window.close(wall_s=4.0)
    totals.update(wall=9.0, cpu=9.0)
    window.close(wall_s=99.0)  # a second close changes nothing
    # THEN only the window's fetches count, and its wall is the one given at the first close
    assert window.spent.wall_s == 4.0 and window.spent.fetch_wall_s == 2.0 and window.spent.fetch_cpu_s == 1.0
    assert window.sampler.status.startswith("absent")  # no NVML on the CPU, and it says why


def test_the_window_opens_after_a_full_collection_so_start_ups_backlog_is_not_measured():
    # GIVEN garbage cycles left from start-up, and a note of every full (generation 2) collection's end
    class Cycle:
        def __init__(self):
            self.me = self

    for _ in range(1000):
        Cycle()
    full_ends: list[float] = []

    def note(phase, info):
        if phase == "stop" and info["generation"] == 2:
            full_ends.append(time.perf_counter())

    gc.callbacks.append(note)
    try:
        started = Window("cpu", lambda: (0.0, 0.0)).open()
    finally:
        gc.callbacks.remove(note)
    # THEN a full collection ran, and the clock the first measured step is timed from starts after it
    assert full_ends and started >= full_ends[-1]


def measurement(workers: int, fetch_wall_s: float, fetch_cpu_s: float, cycle: int = 1) -> Measurement:
    return Measurement(Spent(2.0, 1.0, fetch_wall_s, fetch_cpu_s), workers, epochs_started=1, epoch_steps=None,
                       epoch_start_steps=[], input_shapes=1, cycle=cycle)


@pytest.mark.parametrize("workers, wall, cpu, frac", [(0, 1.0, 0.25, 0.25), (0, 1.0, 1.02, 1.0),
                                                      (2, 1.0, 0.5, None), (0, 0.0, 0.0, None)])
def test_the_fetch_cpu_share_is_the_loading_threads_and_only_without_workers(workers, wall, cpu, frac):
    assert measurement(workers, wall, cpu).fetch_cpu_frac() == frac


def test_noise_is_judged_over_loader_waves_and_accumulation_cycles_alike():
    # GIVEN steps that repeat every 6 (2 workers, an optimizer step every 3 batches): one slow step in six
    step_s = [0.3, 0.1, 0.1, 0.1, 0.1, 0.1] * 8
    assert measurement(2, 0, 0, cycle=3).extra(step_s)["noise"] == 0.0
    assert measurement(2, 0, 0, cycle=1).extra(step_s)["noise"] > 0.0  # waves of 2 would mix slow and fast
    assert math.isinf(measurement(0, 0, 0).extra(step_s[:3])["noise"])  # too few steps to judge


HUNG_LOADER = """
import threading, time
import torch
from torch.utils.data import DataLoader, Dataset
from tune_advisor.probe.measure import LoaderHung, hung_loader


class Hangs(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, idx):
        threading.Event().wait()


batches = iter(DataLoader(Hangs(), num_workers=2, timeout=0.5))
try:
    next(batches)
except RuntimeError as exc:
    hung = hung_loader(exc, 0.5)
time.sleep(1.0)  # where torch's SIGCHLD handler would raise, had the workers' deaths reached it
print(type(hung).__name__, "ok")
"""


def test_a_hung_loaders_workers_are_killed_without_torchs_handler_calling_it_a_crash():
    # GIVEN loader workers that hang past the DataLoader's timeout, in a process of its own (torch's SIGCHLD handler
    # is process-wide); WHEN hung_loader kills them THEN no "worker killed" error follows, and the hang is LoaderHung
    done = subprocess.run([sys.executable, "-c", HUNG_LOADER], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["LoaderHung", "ok"], done.stderr[-2000:]
