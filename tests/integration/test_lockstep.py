"""Lockstep pairs of real probe children (the gate's interleaved mode): turns, failures, the wall-clock limit."""

from __future__ import annotations

import dataclasses

import psutil
import pytest

from tune_advisor import knobs
from tune_advisor.probe import lockstep
from tune_advisor.probe.result import Status
from tune_advisor.probe.spec import ProbeSpec

from ..conftest import FAST, WORKLOADS

TINY = WORKLOADS / "tiny_mlp.py"
SETTINGS = knobs.full_settings({"batch_size": 16})
# tiny_mlp, but its compute_loss does FAILURE on call number FAIL_AT (the warm-up step is call 1).
FAILING = TINY.read_text() + '''

import time
import torch.nn.functional as F

CALLS = 0


def compute_loss(model, batch):
    global CALLS
    CALLS += 1
    if CALLS == FAIL_AT:
        FAILURE
    x, y = batch
    return F.cross_entropy(model(x), y)
'''


@pytest.fixture
def spawned(monkeypatch):
    """Children as new processes, started side by side: quicker here than two zygotes started one after the
    other, which pytest makes each test do (the environment, which the zygotes are keyed on, names the test)."""
    monkeypatch.setenv("TUNE_ADVISOR_NO_ZYGOTE", "1")


def specs(tmp_path, other=TINY, timeout_s=60.0):
    return [ProbeSpec(id=f"{name}-1", workload=str(path), settings=SETTINGS, protocol=FAST, timeout_s=timeout_s)
            for name, path in (("reference", TINY), ("candidate", other))]


def failing(tmp_path, failure: str, fail_at: int = 5):
    path = tmp_path / "failing.py"
    path.write_text(FAILING.replace("FAIL_AT", str(fail_at)).replace("FAILURE", failure))
    return path


def turns(results) -> str:
    """Who stepped when ("r" or "c"), from the step spans each child recorded; fails if two steps overlapped."""
    spans = sorted((a, b, r.id[0]) for r in results for a, b in r.extra["lockstep"]["spans"])
    assert all(end <= start for (_, end, _), (start, _, _) in zip(spans, spans[1:])), "steps overlapped"
    return "".join(name for _, _, name in spans)


def test_a_pair_measures_both_sides_in_strict_turns(tmp_path):
    # WHEN two probes run in lockstep, the candidate first (each forked from a zygote of its own)
    results = lockstep.run_pair(specs(tmp_path), tmp_path, ["gate:reference", "gate:candidate"], first=1)
    # THEN both are ordinary ok probes with the same number of measured steps
    reference, candidate = results
    assert [r.status for r in results] == [Status.OK, Status.OK], [r.error for r in results]
    n = len(reference.step_s)
    assert n == len(candidate.step_s) >= FAST.min_steps
    assert all(r.peak_memory_bytes and r.wall_s > 0 and r.role.startswith("gate:") for r in results)
    # AND the steps alternated C R, R C, ..., as each child recorded them
    assert turns(results) == "".join(("cr", "rc")[i % 2] for i in range(n))
    assert [r.extra["lockstep"]["steps"] for r in results] == [n, n]
    assert [r.extra["lockstep"]["first"] for r in results] == [False, True]
    assert {r.extra["lockstep"]["stopped"] for r in results} == {"measured"}
    # AND each child's measuring time is its own steps, not its partner's turns
    for r in results:
        assert sum(r.step_s) <= r.extra["measured_wall_s"] < sum(r.step_s) + 0.5 * r.extra["lockstep"]["waited_s"]
    # AND the candidate, moving first, built its workload and warmed up first, then the reference, never both at once
    (r_from, r_to), (c_from, c_to) = (r.extra["lockstep"]["warm_span"] for r in results)
    assert c_from < c_to <= r_from < r_to <= min(a for r in results for a, _ in r.extra["lockstep"]["spans"])


def test_a_pairs_new_parents_start_together_before_either_side_forks(tmp_path, monkeypatch):
    from tune_advisor.probe import runner

    events = []

    class Logged(runner.Zygote):
        def __init__(self, *args, **kwargs):
            events.append("start")
            super().__init__(*args, **kwargs)

        def request(self, message, ready_by=None):
            events.append("fork")
            return super().request(message, ready_by)

    monkeypatch.setattr(runner, "Zygote", Logged)
    # GIVEN a pair that forked its sides from the two long-lived zygotes (as the search's duels do)
    results = lockstep.run_pair(specs(tmp_path), tmp_path / "search", ["reference", "candidate"])
    assert [r.status for r in results] == [Status.OK, Status.OK]
    served = dict(runner._zygotes)
    assert sorted(served) == [0, 1] and events == ["start", "fork", "start", "fork"]
    # WHEN a pair asks for new parents (as the confirmation's rounds do)
    events.clear()
    fresh = [dataclasses.replace(spec, fresh_parent=True) for spec in specs(tmp_path)]
    results = lockstep.run_pair(fresh, tmp_path / "confirm", ["reference", "candidate"])
    # THEN both new zygotes start before either side forks (their imports of torch overlap, one start's wait, not
    # two), each side forks from one of them, and the old ones have ended
    assert [r.status for r in results] == [Status.OK, Status.OK]
    assert events == ["start", "start", "fork", "fork"]
    assert all(runner._zygotes[slot] is not served[slot] and served[slot].proc.poll() is not None for slot in (0, 1))
    assert all(runner._zygotes[slot].forked for slot in (0, 1))


def test_a_side_that_crashes_mid_round_ends_it_with_its_status(tmp_path, spawned):
    # GIVEN a candidate that crashes (SIGABRT) in its 4th measured step (1 warm-up step)
    pair = specs(tmp_path, failing(tmp_path, "import os; os.abort()"))
    # WHEN the pair runs
    reference, candidate = lockstep.run_pair(pair, tmp_path, ["gate:reference", "gate:candidate"])
    # THEN the candidate keeps its own status and cause, and the reference was stopped cleanly after it: its
    # steps are kept, but half a comparison is no verdict on its settings (stopped, not ok, not a failure)
    assert candidate.status is Status.CRASHED and "SIGABRT" in candidate.error and "failing.py" in candidate.error
    assert reference.status is Status.STOPPED and reference.extra["lockstep"]["stopped"] == "candidate-1 ended"
    assert "partner candidate-1 ended (crashed) after 3 measured steps" in reference.error
    assert len(reference.step_s) == 3  # r c c r r c c: the candidate's 4th step never came back
    assert reference.extra["lockstep"]["partner"] == "candidate-1" and candidate.paired_with == "reference-1"


@pytest.mark.parametrize("failure, fail_at, status", [
    ("raise RuntimeError('DefaultCPUAllocator: not enough memory: you tried to allocate 1 bytes')", 2, Status.OOM),
    ("raise ValueError('bad batch')", 2, Status.ERROR),
    ("import os; os.abort()", 1, Status.CRASHED),
])
def test_a_partner_that_fails_before_any_measured_step_leaves_a_stopped_side_without_figures(
        tmp_path, spawned, failure, fail_at, status):
    # GIVEN a candidate that fails in its warm-up (call 1) or its first measured step (call 2), moving first
    pair = specs(tmp_path, failing(tmp_path, failure, fail_at=fail_at))
    # WHEN the pair runs
    reference, candidate = lockstep.run_pair(pair, tmp_path, ["recheck", "ladder:batch_size"], first=1)
    # THEN the candidate has its own status, and the reference, which measured nothing, is never "ok"
    assert candidate.status is status, candidate.error
    assert reference.status is Status.STOPPED and not reference.ok and reference.step_s == [], reference.error
    assert f"partner candidate-1 ended ({status.value})" in reference.error


def test_a_partner_that_ends_while_this_side_still_builds_leaves_it_stopped_not_failed(tmp_path, spawned):
    # GIVEN a reference whose workload file takes 3 s to import, and a candidate that moves first and crashes in its
    # warm-up: the pair has ended before the reference joins it
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(3)\n" + TINY.read_text())
    pair = [dataclasses.replace(specs(tmp_path)[0], workload=str(slow)),
            specs(tmp_path, failing(tmp_path, "import os; os.abort()", fail_at=1))[1]]
    # WHEN the pair runs
    reference, candidate = lockstep.run_pair(pair, tmp_path, ["recheck", "ladder:batch_size"], first=1)
    # THEN the reference finds the parent's "stop" waiting for it and ends stopped by its partner, not as a failure
    # of its own ("cannot join the gate's lockstep (No such file or directory)": the parent had removed the pair's
    # channels before the late side opened them, in about one run of four of the test above)
    assert candidate.status is Status.CRASHED
    assert reference.status is Status.STOPPED and reference.step_s == [], reference.error
    assert "partner candidate-1 ended (crashed)" in reference.error


def test_the_wall_clock_limit_kills_both_sides(tmp_path, spawned):
    # GIVEN a candidate whose 3rd measured step never ends, and a 3 s probe timeout: 6 s for a lockstep side
    pair = specs(tmp_path, failing(tmp_path, "time.sleep(600)", fail_at=4), timeout_s=3)
    # WHEN the pair runs
    results = lockstep.run_pair(pair, tmp_path, ["gate:reference", "gate:candidate"])
    # THEN the stuck side is a timeout at the limit, its partner stopped (not held against its settings), and no
    # process of either is left
    reference, candidate = results
    assert [r.status for r in results] == [Status.STOPPED, Status.TIMEOUT]
    assert "6 s limit of a lockstep side" in candidate.error
    assert "partner candidate-1 ended (timeout) and this side was stopped with it" in reference.error
    assert reference.extra["lockstep"]["stopped"] == "candidate-1 timed out"
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []


def test_a_pair_whose_new_parents_are_not_ready_by_the_deadline_stops_there(tmp_path, stuck_zygotes):
    # GIVEN a confirmation round's pair (new parents) with 3 s of the budget left, whose parents never get ready
    pair = [dataclasses.replace(spec, fresh_parent=True, budget_left_s=3.0) for spec in specs(tmp_path)]
    results = lockstep.run_pair(pair, tmp_path, ["confirm:reference", "confirm:candidate"])
    # THEN the pair ends at its deadline (the second side waits no longer than the first), both sides stopped by
    # the budget, not failed, and both parents are ended
    assert [r.status for r in results] == [Status.STOPPED, Status.STOPPED]
    assert 3.0 <= results[0].wall_s < 4.0 and results[1].wall_s < 1.0
    assert results[0].extra["budget_stopped"] and "lockstep partner" in results[1].error
    assert len(stuck_zygotes) == 2 and all(zygote.proc.poll() is not None for zygote in stuck_zygotes)
