"""Peak resident memory of a process and all its descendants (the probe child and its loader workers).

Sampled from the parent so that a child killed mid-step still has a peak, and so that sampling costs the timed
steps nothing but a few /proc reads per interval.
"""

from __future__ import annotations

import os
import threading

import psutil

# 2 Hz: training memory repeats every step, so the steady state is caught; the child's own exact peak (maxrss) is
# added by the runner. Sampling faster wakes the parent often enough to slow the probe on a 2-core machine.
INTERVAL_S = 0.5


class TreeMemorySampler:
    def __init__(self, pid: int, interval_s: float = INTERVAL_S):
        self.pid, self.interval_s = pid, interval_s
        self.peak_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"memory-sampler-{pid}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> int:
        """RSS of the tree now, in bytes (shared copy-on-write pages of forked workers count once per process)."""
        if _HAS_PROC_CHILDREN:
            return _proc_tree_rss(self.pid)
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        return total


    def _run(self) -> None:
        while not self._stop.is_set():
            current = self.sample()
            self.samples += 1
            self.peak_bytes = max(self.peak_bytes, current)
            self._stop.wait(self.interval_s)


# psutil finds children by scanning every process in /proc (~1 ms here), and on a 2-core machine the parent's
# CPU time is taken from the probe it watches. Linux lists a task's children directly, and statm is one read.
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_HAS_PROC_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _proc_tree_rss(pid: int) -> int:
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/statm") as f:
                total += int(f.read().split()[1]) * _PAGE
            # Children of the main thread only: DataLoader workers are forked from it.
            with open(f"/proc/{current}/task/{current}/children") as f:
                stack.extend(int(c) for c in f.read().split())
        except (OSError, ValueError, IndexError):
            continue  # the process ended between reads
    return total
