"""Peak resident memory of a process and all its descendants (the probe child and its loader workers).

Sampled from the parent so that a child killed mid-step still has a peak, and so that sampling costs the timed
steps nothing but a few /proc reads per interval.

Forked loader workers share their parent's pages copy-on-write, and each worker's RSS counts those pages again
(32 workers of a 260 MiB child summed to 7.7 GiB). So the tree's footprint is counted as the root's RSS plus, for
every other process, its RSS less the bytes it shares (smaps_rollup: Rss - Private_Clean - Private_Dirty): a
page shared with the parent is counted once, in the parent's RSS. smaps_rollup walks a process's page tables
(~5 ms a process here, against ~0.03 ms for statm), so the shared bytes are read again only now and then
(`SMAPS_SHARE`); in between, each tick reads every process's RSS and subtracts the shared bytes last read, and a
worker not seen before (workers restart each epoch) is taken to share what the workers read shared on average.
Where smaps_rollup cannot be read (an old kernel, no permission, no /proc) the figure is the summed RSS, and
`peak_counts` says so; a worker that ended, is exiting or waits to be reaped (a zombie) is skipped, not taken
for that. The summed RSS is kept too (`rss_sum_peak_bytes`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable, NamedTuple

import psutil

# 2 Hz: training memory repeats every step, so the steady state is caught; the child's own exact peak (maxrss) is
# added by the runner. Sampling faster wakes the parent often enough to slow the probe on a 2-core machine.
INTERVAL_S = 0.5
# The share of wall time the sampler may spend reading smaps_rollup: after a refresh that took t seconds the next
# is due max(SMAPS_FLOOR_S, t / SMAPS_SHARE) later (9 workers: ~47 ms, so every ~2.4 s). The floor keeps a cheap
# tree from being read on every tick; the shared bytes drift only as workers write to copy-on-write pages.
SMAPS_SHARE = 0.02
SMAPS_FLOOR_S = 2.0

# How the peak was counted (results.json: memory.tree_peak_counts).
ONE_PROCESS = "one process (RSS)"
SHARED_ONCE = "shared pages once (smaps_rollup)"
SUMMED_RSS = "summed RSS"


class Tick(NamedTuple):
    """One sample of the tree: its footprint (shared pages once where known), its summed RSS, how the footprint
    was counted, and how many processes it had."""

    bytes: int
    rss_sum: int
    counts: str
    processes: int


class TreeMemorySampler:
    """`proc_root`: where /proc is (tests point it at a fake one); `clock`: seconds, for the smaps_rollup refresh
    interval and its cost."""

    def __init__(self, pid: int, interval_s: float = INTERVAL_S, proc_root: str | os.PathLike | None = None,
                 clock: Callable[[], float] = time.perf_counter, refresh_floor_s: float = SMAPS_FLOOR_S):
        self.pid, self.interval_s = pid, interval_s
        self.peak_bytes = 0  # the footprint's peak: pages shared by forked workers counted once where readable
        self.rss_sum_peak_bytes = 0  # the peak of every process's RSS summed
        self.peak_counts: str | None = None  # how the sample that set peak_bytes was counted
        self.samples = 0
        # smaps_rollup refreshes: how many, how many files read, and the seconds they took (by `clock`)
        self.smaps_refreshes, self.smaps_reads, self.smaps_s = 0, 0, 0.0
        self.smaps_unreadable: str | None = None  # why smaps_rollup is not used, once a read showed it cannot be
        explicit = proc_root is not None
        root = str(proc_root) if explicit else "/proc"
        self._proc = root if os.path.isdir(root) else None
        # Walk /proc's children lists where there are some (or a fake /proc was given); else psutil (macOS).
        self._walk_proc = self._proc is not None and (explicit or _HAS_PROC_CHILDREN)
        if self._proc is None:
            self.smaps_unreadable = "no /proc"
        self._clock, self._floor = clock, refresh_floor_s
        self._shared: dict[int, int] = {}  # worker pid -> the bytes it shared when last read
        self._shared_mean: float | None = None  # their mean: for workers not read yet
        self._next_refresh = -math.inf
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"memory-sampler-{pid}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> int:
        """The tree's footprint now, in bytes (pages shared by forked workers counted once where readable)."""
        return self.measure().bytes

    def tick(self) -> Tick:
        """Sample once and keep the peaks."""
        tick = self.measure()
        self.samples += 1
        if tick.processes and (self.peak_counts is None or tick.bytes > self.peak_bytes):
            self.peak_bytes, self.peak_counts = tick.bytes, tick.counts
        self.rss_sum_peak_bytes = max(self.rss_sum_peak_bytes, tick.rss_sum)
        return tick

    def measure(self) -> Tick:
        procs = self._tree()  # (pid, rss), the root first
        rss_sum = sum(rss for _, rss in procs)
        if len(procs) <= 1:
            return Tick(rss_sum, rss_sum, ONE_PROCESS, len(procs))
        workers = procs[1:]
        if self._proc is not None and self.smaps_unreadable is None and (
                self._shared_mean is None or self._clock() >= self._next_refresh):
            self._refresh([pid for pid, _ in workers])
        if self.smaps_unreadable is not None or self._shared_mean is None:
            return Tick(rss_sum, rss_sum, SUMMED_RSS, len(procs))
        footprint = procs[0][1] + sum(max(0, rss - self._shared.get(pid, self._shared_mean)) for pid, rss in workers)
        return Tick(int(footprint), rss_sum, SHARED_ONCE, len(procs))

    def _tree(self) -> list[tuple[int, int]]:
        if self._walk_proc:
            return proc_tree(self._proc, self.pid)
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        found = []
        for p in procs:
            try:
                found.append((p.pid, p.memory_info().rss))
            except psutil.Error:
                continue
        return found

    def _refresh(self, pids: list[int]) -> None:
        """Read the bytes each worker shares; the next refresh is due when this one's cost is SMAPS_SHARE of the
        time since."""
        start = self._clock()
        shared = {}
        for pid in pids:
            self.smaps_reads += 1
            try:
                shared[pid] = read_shared_bytes(self._proc, pid)
            except (OSError, ValueError) as e:
                # ESRCH: the process has no memory map any more (exiting: its state still reads R until it is a
                # zombie; torch.compile's compile workers end so) or it ended, or it waits to be reaped
                if isinstance(e, ProcessLookupError) or not is_running(self._proc, pid):
                    continue
                self.smaps_unreadable = f"{pid}/smaps_rollup: {e.__class__.__name__}: {e}"
                break
        cost = self._clock() - start
        self.smaps_refreshes += 1
        self.smaps_s += cost
        self._next_refresh = start + cost + max(self._floor, cost / SMAPS_SHARE)
        if shared:
            self._shared = shared
            self._shared_mean = sum(shared.values()) / len(shared)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.interval_s)


# psutil finds children by scanning every process in /proc (~1 ms here), and on a 2-core machine the parent's
# CPU time is taken from the probe it watches. Linux lists a task's children directly, and statm is one read.
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_HAS_PROC_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def read_statm_rss(proc: str, pid: int) -> int:
    """A process's resident bytes (statm: the second field, in pages)."""
    with open(f"{proc}/{pid}/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def is_running(proc: str, pid: int) -> bool:
    """Whether a process is still running: its stat is readable and its state is not Z (a zombie) or X (dead).
    An exited worker waits as a zombie until its parent reaps it (non-persistent DataLoader workers, at every
    epoch's end): its statm still reads (all zeros) while its smaps_rollup raises "No such process"."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X", "x")


def read_children(proc: str, pid: int) -> list[int]:
    """The children of a process's main thread: DataLoader workers are forked from it."""
    with open(f"{proc}/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


def read_shared_bytes(proc: str, pid: int) -> int:
    """The resident bytes a process shares with others: Rss - Private_Clean - Private_Dirty of smaps_rollup."""
    fields = {}
    with open(f"{proc}/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Private_Clean", "Private_Dirty"):
                fields[key] = int(rest.split()[0]) * 1024  # kB
    if len(fields) < 3:
        raise ValueError(f"no {', '.join(sorted({'Rss', 'Private_Clean', 'Private_Dirty'} - set(fields)))} line")
    return max(0, fields["Rss"] - fields["Private_Clean"] - fields["Private_Dirty"])


def proc_tree(proc: str, pid: int) -> list[tuple[int, int]]:
    """(pid, resident bytes) of a process and all its descendants, the process first; [] when it has ended."""
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        try:
            rss = read_statm_rss(proc, current)
            children = read_children(proc, current)
        except (OSError, ValueError, IndexError):
            continue  # the process ended between reads
        found.append((current, rss))
        stack.extend(children)
    return found
