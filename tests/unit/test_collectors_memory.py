"""The tree memory sampler against a fake /proc: shared pages counted once, refreshes bounded, the fallbacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tune_advisor.collectors import memory
from tune_advisor.collectors.memory import ONE_PROCESS, SHARED_ONCE, SUMMED_RSS, TreeMemorySampler

MB = 2**20
ROOT = 100


class FakeProc:
    """A /proc directory in tmp_path: statm and a children list for every process, smaps_rollup for those that
    say what they share (`shared=None`: no smaps_rollup, as on a kernel without one)."""

    def __init__(self, path):
        self.path = path

    def process(self, pid, rss, children=(), shared=None, private=0, state="S"):
        folder = self.path / str(pid)
        (folder / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
        (folder / "statm").write_text(f"99999 {rss // memory._PAGE} 0 0 0 0 0\n")
        (folder / "stat").write_text(f"{pid} (pt_data_worker) {state} {ROOT} 1 1 0 -1\n")
        (folder / "task" / str(pid) / "children").write_text("".join(f"{c} " for c in children))
        if shared is not None:
            (folder / "smaps_rollup").write_text(
                f"00400000-7fff00000000 ---p 00000000 00:00 0    [rollup]\nRss: {(shared + private) // 1024} kB\n"
                f"Pss: {private // 1024} kB\nShared_Clean: {shared // 1024} kB\nShared_Dirty: 0 kB\n"
                f"Private_Clean: 0 kB\nPrivate_Dirty: {private // 1024} kB\n")
        return self

    def worker(self, pid, shared, private):
        return self.process(pid, shared + private, shared=shared, private=private)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def sampler_for(proc, clock=None, floor=2.0):
    return TreeMemorySampler(ROOT, proc_root=proc.path, clock=clock or Clock(), refresh_floor_s=floor)


def test_workers_sharing_the_roots_pages_count_them_once(tmp_path):
    # GIVEN a 300 MB root with 3 forked workers, each sharing 200 MB with it and holding 10 MB of its own
    proc = FakeProc(tmp_path).process(ROOT, 300 * MB, children=[1, 2, 3])
    for pid in (1, 2, 3):
        proc.worker(pid, shared=200 * MB, private=10 * MB)
    sampler = sampler_for(proc)

    tick = sampler.tick()

    # THEN the footprint is the root plus the workers' private pages, not root + 3 x 210 MB
    assert tick.bytes == 330 * MB
    assert tick.rss_sum == 930 * MB and tick.counts == SHARED_ONCE and tick.processes == 4
    # AND both peaks are kept, with how the shared-once one was counted
    assert sampler.peak_bytes == 330 * MB and sampler.rss_sum_peak_bytes == 930 * MB
    assert sampler.peak_counts == SHARED_ONCE
    assert sampler.smaps_refreshes == 1 and sampler.smaps_reads == 3  # the workers' files, not the root's


def test_a_worker_not_read_yet_is_taken_to_share_the_known_workers_mean(tmp_path):
    # GIVEN three workers read sharing 100, 150 and 200 MB (mean 150 MB)
    proc = FakeProc(tmp_path).process(ROOT, 300 * MB, children=[1, 2, 3])
    for pid, shared in ((1, 100), (2, 150), (3, 200)):
        proc.worker(pid, shared=shared * MB, private=10 * MB)
    clock = Clock()
    sampler = sampler_for(proc, clock)
    assert sampler.tick().bytes == 330 * MB

    # WHEN the next epoch's worker 4 (160 MB resident) appears before the next refresh is due
    proc.process(ROOT, 300 * MB, children=[1, 2, 3, 4]).worker(4, shared=10 * MB, private=150 * MB)
    clock.now = 0.5
    tick = sampler.tick()

    # THEN it counts 160 - 150 MB, without its smaps_rollup read
    assert tick.bytes == 340 * MB
    assert sampler.smaps_reads == 3


def test_a_worker_appearing_before_any_was_read_is_read_at_once(tmp_path):
    # GIVEN a root sampled alone, then with its first worker
    proc = FakeProc(tmp_path).process(ROOT, 300 * MB)
    sampler = sampler_for(proc)
    assert sampler.tick().counts == ONE_PROCESS
    proc.process(ROOT, 300 * MB, children=[1]).worker(1, shared=200 * MB, private=10 * MB)

    # THEN the worker's smaps_rollup is read on the tick that first sees it
    assert sampler.tick().bytes == 310 * MB
    assert sampler.smaps_reads == 1


def test_shared_bytes_are_reread_only_once_the_refresh_interval_passed(tmp_path, monkeypatch):
    # GIVEN three workers whose smaps_rollup takes 10 ms each to read (30 ms a refresh: due 1.5 s later at 2%)
    proc = FakeProc(tmp_path).process(ROOT, 300 * MB, children=[1, 2, 3])
    for pid in (1, 2, 3):
        proc.worker(pid, shared=200 * MB, private=10 * MB)
    clock = Clock()
    real_read = memory.read_shared_bytes

    def slow_read(root, pid):
        clock.now += 0.010
        return real_read(root, pid)

    monkeypatch.setattr(memory, "read_shared_bytes", slow_read)
    sampler = sampler_for(proc, clock, floor=0.5)
    sampler.tick()
    assert sampler.smaps_refreshes == 1 and sampler.smaps_s == pytest.approx(0.030)

    # WHEN the workers write to 50 MB of the pages they shared (copy-on-write: RSS unchanged, shared down)
    for pid in (1, 2, 3):
        proc.worker(pid, shared=150 * MB, private=60 * MB)
    # THEN ticks within the interval keep the shared bytes last read
    for now in (0.5, 1.0, 1.5):
        clock.now = now
        assert sampler.tick().bytes == 330 * MB
    assert sampler.smaps_refreshes == 1 and sampler.smaps_reads == 3

    # AND the first tick past it reads them again
    clock.now = 1.6
    assert sampler.tick().bytes == 480 * MB
    assert sampler.smaps_refreshes == 2 and sampler.smaps_reads == 6
    # AND the peak follows the figure counted once, the summed RSS its own
    assert sampler.peak_bytes == 480 * MB and sampler.rss_sum_peak_bytes == 930 * MB


def test_the_refresh_floor_holds_for_a_cheap_refresh(tmp_path):
    # GIVEN a refresh that costs nothing by the clock
    proc = FakeProc(tmp_path).process(ROOT, 300 * MB, children=[1]).worker(1, shared=200 * MB, private=10 * MB)
    clock = Clock()
    sampler = sampler_for(proc, clock, floor=2.0)
    sampler.tick()
    # THEN the next one waits for the floor
    clock.now = 1.9
    sampler.tick()
    assert sampler.smaps_refreshes == 1
    clock.now = 2.0
    sampler.tick()
    assert sampler.smaps_refreshes == 2


def test_unreadable_smaps_rollup_falls_back_to_summed_rss_and_says_so(tmp_path):
    # GIVEN workers without smaps_rollup (a kernel before 4.14, or not permitted)
    proc = FakeProc(tmp_path).process(ROOT, 300 * MB, children=[1, 2])
    for pid in (1, 2):
        proc.process(pid, 210 * MB)
    clock = Clock()
    sampler = sampler_for(proc, clock)

    tick = sampler.tick()

    # THEN the figure is the summed RSS, and the sampler says that is how it was counted
    assert tick.bytes == tick.rss_sum == 720 * MB and tick.counts == SUMMED_RSS
    assert sampler.peak_bytes == sampler.rss_sum_peak_bytes == 720 * MB and sampler.peak_counts == SUMMED_RSS
    assert "smaps_rollup" in sampler.smaps_unreadable
    # AND it does not try again on later ticks
    clock.now = 100.0
    sampler.tick()
    assert sampler.smaps_reads == 1


def test_a_worker_ending_before_its_smaps_read_is_not_taken_for_unreadable(tmp_path, monkeypatch):
    # GIVEN two workers, the first of which ends between the tree walk and its smaps_rollup read
    proc = FakeProc(tmp_path).process(ROOT, 300 * MB, children=[1, 2])
    for pid in (1, 2):
        proc.worker(pid, shared=200 * MB, private=10 * MB)
    real_read = memory.read_shared_bytes

    def read_after_exit(root, pid):
        if pid == 1:
            for name in ("stat", "statm", "smaps_rollup"):
                (tmp_path / "1" / name).unlink()
        return real_read(root, pid)

    monkeypatch.setattr(memory, "read_shared_bytes", read_after_exit)
    sampler = sampler_for(proc)
    tick = sampler.tick()

    # THEN the other worker's shared bytes are used, and the ended one counts as the mean
    assert sampler.smaps_unreadable is None and tick.counts == SHARED_ONCE
    assert tick.bytes == 320 * MB


def test_an_exited_worker_waiting_to_be_reaped_is_not_taken_for_unreadable(tmp_path):
    # GIVEN a worker that exited and waits as a zombie (statm still reads, all zeros; smaps_rollup does not)
    proc = FakeProc(tmp_path).process(ROOT, 300 * MB, children=[1, 2])
    proc.worker(1, shared=200 * MB, private=10 * MB)
    proc.process(2, 0, state="Z")
    sampler = sampler_for(proc)

    tick = sampler.tick()

    # THEN the live worker's shared bytes count once, and smaps_rollup stays in use
    assert sampler.smaps_unreadable is None and tick.counts == SHARED_ONCE
    assert tick.bytes == 310 * MB and tick.rss_sum == 510 * MB


def test_a_worker_exiting_whose_map_is_gone_is_not_taken_for_unreadable(tmp_path, monkeypatch):
    # GIVEN a worker in the middle of exiting: its memory map is gone (smaps_rollup raises ESRCH) while its state
    # still reads R (a torch.compile worker ending mid-probe did so)
    proc = FakeProc(tmp_path).process(ROOT, 300 * MB, children=[1, 2])
    proc.worker(1, shared=200 * MB, private=10 * MB)
    proc.worker(2, shared=200 * MB, private=10 * MB)
    real_read = memory.read_shared_bytes

    def exiting(root, pid):
        if pid == 2:
            raise ProcessLookupError(3, "No such process")
        return real_read(root, pid)

    monkeypatch.setattr(memory, "read_shared_bytes", exiting)
    sampler = sampler_for(proc)
    tick = sampler.tick()

    # THEN smaps_rollup stays in use, and the exiting worker counts as the others' mean
    assert sampler.smaps_unreadable is None and tick.counts == SHARED_ONCE
    assert tick.bytes == 320 * MB


ZOMBIE_TREE = """
import os, sys, time
import numpy as np
pages = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MiB that forked children share copy-on-write
for _ in range(2):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
if os.fork() == 0:
    os._exit(0)  # exits at once and is never reaped: a zombie, as a DataLoader worker between epochs
print("ready", flush=True)
time.sleep(60)
"""


def _states(pid):
    states = []
    for child in memory.read_children("/proc", pid):
        with open(f"/proc/{child}/stat") as f:
            states.append(f.read().rpartition(")")[2].split()[0])
    return states


def test_a_real_tree_with_a_zombie_child_still_counts_shared_pages_once():
    # GIVEN a real process with two live forked children sharing its 64 MiB, and one exited child not yet reaped
    root = subprocess.Popen([sys.executable, "-c", ZOMBIE_TREE], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert root.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while sorted(_states(root.pid)) != ["S", "S", "Z"]:  # the two sleeping children and the zombie
            assert time.monotonic() < deadline, _states(root.pid)
            time.sleep(0.05)

        sampler = TreeMemorySampler(root.pid)
        tick = sampler.tick()

        # THEN the zombie is not taken for an unreadable smaps_rollup: the shared pages count once
        assert sampler.smaps_unreadable is None and tick.counts == SHARED_ONCE
        assert tick.rss_sum - tick.bytes > 100 * MB  # both children's 64 MiB of shared pages left out
    finally:
        os.killpg(root.pid, signal.SIGKILL)  # the children too
        root.wait()


def test_a_tree_of_one_process_is_its_rss_without_reading_smaps(tmp_path):
    # GIVEN a root with no workers
    proc = FakeProc(tmp_path).process(ROOT, 300 * MB, shared=50 * MB, private=250 * MB)
    sampler = sampler_for(proc)

    tick = sampler.tick()

    # THEN its RSS, counted as one process, and no smaps_rollup read
    assert tick.bytes == tick.rss_sum == 300 * MB and tick.counts == ONE_PROCESS
    assert sampler.peak_counts == ONE_PROCESS and sampler.smaps_reads == 0


def test_an_ended_root_leaves_no_sample_and_no_count(tmp_path):
    sampler = sampler_for(FakeProc(tmp_path))
    tick = sampler.tick()
    assert tick.bytes == 0 and tick.processes == 0
    assert sampler.peak_bytes == 0 and sampler.peak_counts is None and sampler.samples == 1


def test_without_proc_the_psutil_tree_is_summed_rss(tmp_path):
    # GIVEN no /proc (macOS): psutil lists the tree, here this process and a child it started
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alone = TreeMemorySampler(child.pid, proc_root=tmp_path / "no-proc")
        parent = TreeMemorySampler(memory.os.getpid(), proc_root=tmp_path / "no-proc")

        tick = parent.tick()

        # THEN the processes' RSS are summed, and said to be
        assert tick.processes >= 2 and tick.bytes == tick.rss_sum > 0 and tick.counts == SUMMED_RSS
        assert parent.peak_counts == SUMMED_RSS and parent.smaps_reads == 0
        # AND a process alone is its RSS
        assert alone.tick().counts == ONE_PROCESS and alone.peak_bytes > 0
    finally:
        child.kill()
        child.wait()
