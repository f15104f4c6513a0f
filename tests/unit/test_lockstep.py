"""The lockstep (baton) protocol between the parent and two children: plain Python children, no torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tune_advisor.probe import lockstep
from tune_advisor.probe.spec import ProbeSpec, Protocol
from tune_advisor.probe.window import EPOCH_ROUNDING_CAP

# A child that measures like probe/training.py: a warm-up of WARM_S once the parent says begin, one "step" (a short
# sleep) per baton, then its report to a file. A step number to fail at: positive exits with code 3 (a crash),
# negative hangs (a stuck step), "warmup" exits with code 3 during the warm-up.
CHILD = """
import json, os, sys, time
from tune_advisor.probe.lockstep import Baton, LockstepError

paths, step_s, fail_at, report = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
baton = Baton(paths, 30)
try:
    baton.begin(None, int(sys.argv[6]))
except LockstepError as exc:
    with open(report, "w") as f:
        json.dump({"error": str(exc)}, f)
    sys.exit(1)
time.sleep(float(sys.argv[5]))
if fail_at == "warmup":
    os._exit(3)
fail_at, n = int(fail_at), 0
while baton.wait():
    n += 1
    if n == fail_at:
        os._exit(3)
    time.sleep(3600 if n == -fail_at else step_s)
    baton.done(step_s)
with open(report, "w") as f:
    json.dump(baton.report(), f)
"""
STEP_S = 0.002
WARM_S = 0.05


class FakeProbe:
    """What the conductor needs of runner.Started, for a plain Python child in its own process group."""

    def __init__(self, spec: ProbeSpec, proc: subprocess.Popen):
        self.spec, self.proc, self.pid = spec, proc, proc.pid
        self.deadline = time.monotonic() + spec.timeout_s
        self.timed_out = False

    def kill(self, timed_out: bool = False) -> None:
        os.killpg(self.pid, signal.SIGKILL)
        self.timed_out |= timed_out


def run_pair(channels: list, probes: list, first: int = 0, match_turns: bool = False) -> tuple[str, "lockstep._Pair"]:
    """Conduct two started children over their channels to the end, each waited for; whatever happens, the
    channels are closed and a child still running is killed. Returns (why the pair ended, the pair)."""
    pair = lockstep._Pair(probes, channels, match_turns=match_turns)
    try:
        why, _ = pair.conduct(first)
        for probe in probes:
            probe.proc.wait(timeout=30)
    finally:
        pair.close()
        for channel in channels:
            channel.close()
        for probe in probes:
            if probe.proc.poll() is None:
                probe.kill()
    return why, pair


def conduct(tmp_path: Path, protocol: Protocol, first: int = 0, fail_at=(0, 0), timeout_s: float = 30,
            cycles=(1, 1), step_s=(STEP_S, STEP_S), match_turns: bool = False, record: dict | None = None):
    """Start two fake children in lockstep and conduct them (`cycles`: each side's steps per optimizer step;
    `step_s`: each side's step time); returns (why, children, reports, seconds taken). `record` receives the
    steps of each side's turns."""
    channels, probes = [], []
    for side, name in enumerate("ab"):
        channels.append(lockstep._Channel(tmp_path, name))
        spec = ProbeSpec(id=name, workload="", settings={"num_workers": 0}, protocol=protocol, timeout_s=timeout_s)
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(channels[-1].paths), str(step_s[side]),
                                 str(fail_at[side]), str(tmp_path / f"{name}.json"), str(WARM_S),
                                 str(cycles[side])],
                                start_new_session=True)
        probes.append(FakeProbe(spec, proc))
    started = time.monotonic()
    why, pair = run_pair(channels, probes, first, match_turns)
    if record is not None:
        record["turns"] = pair.turns
    took = time.monotonic() - started
    reports = {name: json.loads((tmp_path / f"{name}.json").read_text()) if (tmp_path / f"{name}.json").exists()
               else None for name in "ab"}
    return why, probes, reports, took


def turns(reports: dict) -> str:
    """Who stepped when: the sides' step spans in time order, e.g. "abbaab"; raises if two steps overlapped."""
    spans = sorted((start, end, name) for name, report in reports.items() for start, end in report["spans"])
    for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
        assert end <= start, "two steps ran at the same time"
    return "".join(name for _, _, name in spans)


def bare_pair() -> lockstep._Pair:
    """A conductor without children, for its stopping rule alone (one step a turn)."""
    pair = object.__new__(lockstep._Pair)
    pair.reps, pair.match_turns = [1, 1], False
    return pair


def enough(pair: lockstep._Pair, steps: list[list[float]]) -> bool:
    """Whether the pair would stop after these steps, each side having taken them one a turn."""
    pair.turns = [[1] * len(s) for s in steps]
    return pair._enough(steps)


@pytest.mark.parametrize("protocol, steps, first", [
    (Protocol(min_steps=5, min_time_s=10 * STEP_S, max_steps=100, max_time_s=10), 10, 0),  # min time: 10 steps
    (Protocol(min_steps=7, min_time_s=0, max_steps=100, max_time_s=10), 7, 1),  # min steps
    (Protocol(min_steps=50, min_time_s=1, max_steps=4, max_time_s=10), 4, 0),  # the step cap
    (Protocol(min_steps=50, min_time_s=1, max_steps=100, max_time_s=5 * STEP_S), 5, 1),  # the time cap, per side
])
def test_two_children_take_turns_a_b_b_a_and_stop_together(tmp_path, protocol, steps, first):
    # GIVEN two children waiting for the baton  WHEN the parent conducts them
    why, probes, reports, _ = conduct(tmp_path, protocol, first)
    # THEN both measured the same number of steps, never at the same time, alternating A B, B A, ...
    assert why == "measured"
    assert reports["a"]["steps"] == reports["b"]["steps"] == steps
    a, b = ("a", "b") if first == 0 else ("b", "a")
    assert turns(reports) == "".join((a + b, b + a)[i % 2] for i in range(steps))
    # AND both were told to stop and exited by themselves, having waited for each other
    assert [p.proc.returncode for p in probes] == [0, 0]
    assert reports["a"]["waited_s"] > 0 and reports["b"]["waited_s"] > 0
    # AND they warmed up one at a time, the first mover first: two warm-ups at once would oversubscribe the cores
    (start_1, end_1), (start_2, end_2) = (reports[side]["warm_span"] for side in (a, b))
    assert end_1 - start_1 >= WARM_S and end_2 - start_2 >= WARM_S
    assert end_1 <= start_2 and end_2 <= min(start for start, _ in reports[a]["spans"])


@pytest.mark.parametrize("match_turns", [True, False])
def test_a_side_with_much_shorter_steps_takes_as_many_a_turn_as_last_one_of_its_partners(tmp_path, match_turns):
    # GIVEN a side whose steps take 4 ms beside a partner's 20 ms (a batch several times smaller)
    record = {}
    why, _, reports, _ = conduct(tmp_path, Protocol(min_steps=8, min_time_s=0, max_steps=400, max_time_s=10),
                                 step_s=(0.004, 0.020), match_turns=match_turns, record=record)
    a_turns, b_turns = record["turns"]
    assert why == "measured" and len(a_turns) == len(b_turns) >= 8
    # THEN with matched turns, after MATCH_AFTER pairs of single steps, the shorter side takes 5 steps a turn and
    # its partner one, so both sides' turns last as long (a cost paid once a turn weighs alike on both)
    if match_turns:
        assert a_turns[:lockstep.MATCH_AFTER] == [1] * lockstep.MATCH_AFTER
        assert set(a_turns[lockstep.MATCH_AFTER:]) == {5} and set(b_turns) == {1}
    else:  # the gate's pairs: one step a turn, whatever the steps take
        assert set(a_turns) == set(b_turns) == {1}
    # AND the turns still alternate A B, B A, never overlapping, and each child measured the steps of its turns
    assert turns(reports) == "".join(("a" * ta + "b" * tb, "b" * tb + "a" * ta)[i % 2]
                                     for i, (ta, tb) in enumerate(zip(a_turns, b_turns)))
    assert reports["a"]["steps"] == sum(a_turns) and reports["b"]["steps"] == sum(b_turns)


def test_a_protocol_with_a_turn_length_gives_each_side_the_steps_of_about_that_long_a_turn(tmp_path):
    # GIVEN sides whose steps take 4 ms and 20 ms, measured under a protocol whose turns last about 0.1 s
    record = {}
    protocol = Protocol(min_steps=8, min_time_s=0, max_steps=400, max_time_s=10, turn_s=0.1)
    why, _, reports, _ = conduct(tmp_path, protocol, step_s=(0.004, 0.020), record=record)
    a_turns, b_turns = record["turns"]
    # THEN after MATCH_AFTER pairs of single steps, each side takes the whole number of its steps nearest 0.1 s
    # (about 25 and 5: a cost paid once a turn is spread over a tenth of a second on both sides), unasked by
    # the caller (the protocol carries it)
    assert why == "measured" and a_turns[:lockstep.MATCH_AFTER] == b_turns[:lockstep.MATCH_AFTER] == [1, 1, 1]
    a_later, b_later = set(a_turns[lockstep.MATCH_AFTER:]), set(b_turns[lockstep.MATCH_AFTER:])
    assert len(a_later) == len(b_later) == 1 and 15 <= a_later.pop() <= 30 and 4 <= b_later.pop() <= 6
    # AND the turns alternate whole, and each child measured the steps of its turns
    assert turns(reports) == "".join(("a" * ta + "b" * tb, "b" * tb + "a" * ta)[i % 2]
                                     for i, (ta, tb) in enumerate(zip(a_turns, b_turns)))
    assert reports["a"]["steps"] == sum(a_turns) and reports["b"]["steps"] == sum(b_turns)


def test_timed_turns_measure_to_the_time_cap_not_one_turn_past_the_step_cap(tmp_path):
    # GIVEN sides of 4 ms and 20 ms steps in 0.1 s turns, under a step cap of 40 and a time cap of 1 s (an H200's
    # tiny_batch_mlp: 2.4 ms steps took 135 a half-second turn, and its confirmation pairs stopped after two timed
    # turns at the 200-step cap, 1.3 s a side: two such rounds read 29.55x [8.12, 107.56])
    record = {}
    protocol = Protocol(min_steps=1000, min_time_s=5, max_steps=40, max_time_s=1.0, turn_s=0.1)
    why, _, reports, _ = conduct(tmp_path, protocol, step_s=(0.004, 0.020), record=record)
    a_turns, b_turns = record["turns"]
    # THEN the pair goes on in timed turns until a side has measured about the time cap (ten turns of 0.1 s)
    timed = a_turns[lockstep.MATCH_AFTER:]
    assert why == "measured" and len(timed) >= 8 and sum(a_turns) > 40
    assert reports["a"]["steps"] == sum(a_turns) and reports["b"]["steps"] == sum(b_turns)


def test_timed_turns_are_the_nearest_whole_steps_and_at_least_one():
    assert lockstep.matched_turns([[0.02] * 3, [0.1] * 3], turn_s=0.5) == [25, 5]
    assert lockstep.matched_turns([[0.02] * 3, [0.9] * 3], turn_s=0.5) == [25, 1]  # a step longer than a turn
    assert lockstep.matched_turns([[0.02] * 3, [0.1] * 3]) == [5, 1]  # without: the partner's step's worth


def test_matched_turns_are_compared_turn_by_turn_so_the_shared_moments_still_cancel():
    from tune_advisor.planner.ratios import pair_ratio
    from tune_advisor.probe.result import ProbeResult, Status

    # GIVEN a pair of equal throughput (8 samples in 10 ms beside 40 in 50 ms) on a machine whose speed swings 40%
    # from one turn to the next, with a cost of 3 ms paid at the start of every turn; the shorter side took 5 steps
    # a turn after 3 single ones
    swing = [1.0 if (t // 2) % 2 else 1.4 for t in range(30)]
    a_turns, b_turns = [1, 1, 1] + [5] * 27, [1] * 30
    a_steps = [(0.01 + (0.003 if i == 0 else 0)) * f for f, k in zip(swing, a_turns) for i in range(k)]
    b_steps = [(0.05 + 0.003) * f for f in swing]

    def side(pid, steps, items, record):
        extra = {"lockstep": {"partner": "other", **({"turns": record} if record else {})}}
        return ProbeResult(pid, {"batch_size": items}, Status.OK, raw={"step_s": steps, "items": [items] * len(steps)},
                           extra=extra)

    a, b = side("a", a_steps, 8, a_turns), side("b", b_steps, 40, None)
    median, low, high = pair_ratio([(a, b)])
    # THEN the turns pair up: the swings cancel, and the matched turns' ratio reads the steady-state one, within
    # 1% (the three single-step turns at the start still carry the cost on every step of the shorter side)
    assert 0.99 < low <= median <= high < 1.02
    # AND without the record of its turns the two sides' steps cannot pair: resampled apart, far wider
    a.extra["lockstep"].pop("turns")
    _, low_apart, high_apart = pair_ratio([(a, b)])
    assert np.log(high_apart / low_apart) > 3 * np.log(high / low)


def test_a_side_that_accumulates_gradients_makes_the_pair_measure_whole_cycles(tmp_path):
    # GIVEN a protocol met after 5 pairs, and one side stepping its optimizer every 4 steps (a Trainer accumulating)
    why, _, reports, _ = conduct(tmp_path, Protocol(min_steps=5, min_time_s=0, max_steps=100, max_time_s=10),
                                 cycles=(4, 1))
    # THEN that side's step series repeats every 4 steps, so its noise is judged over 4 whole cycles: 16 steps,
    # each cycle holding its optimizer step (without the cycle, 5 pairs: test_two_children_take_turns...)
    assert why == "measured" and reports["a"]["steps"] == reports["b"]["steps"] == 16


def test_a_child_that_dies_warming_up_ends_the_pair_and_the_other_never_begins(tmp_path):
    # GIVEN a pair whose first child crashes in its warm-up
    protocol = Protocol(min_steps=50, min_time_s=10, max_steps=100, max_time_s=10)
    why, probes, reports, took = conduct(tmp_path, protocol, fail_at=("warmup", 0))
    # THEN the pair ends at once, naming it, and the other child, told to stop before it began, fails saying so
    assert why == "a ended" and took < 10
    assert probes[0].proc.returncode == 3 and probes[1].proc.returncode == 1
    assert "other side of the lockstep pair ended first" in reports["b"]["error"]


def test_a_child_that_crashes_mid_round_ends_it_and_the_other_stops_cleanly(tmp_path):
    # GIVEN a pair whose second child dies in its 4th step
    protocol = Protocol(min_steps=50, min_time_s=10, max_steps=100, max_time_s=10)
    why, probes, reports, took = conduct(tmp_path, protocol, fail_at=(0, 4))
    # THEN the round ends at once, naming the side that ended
    assert why == "b ended" and took < 10
    assert probes[1].proc.returncode == 3 and reports["b"] is None
    # AND the other side was stopped (not killed): it wrote its report with the steps it measured (a b b a a b b)
    assert probes[0].proc.returncode == 0 and reports["a"]["steps"] == 3


def test_a_stuck_step_is_killed_with_its_partner_at_the_wall_clock_limit(tmp_path):
    # GIVEN a pair whose first child hangs in its 3rd step, and a 2 s limit
    protocol = Protocol(min_steps=50, min_time_s=10, max_steps=100, max_time_s=10)
    why, probes, reports, took = conduct(tmp_path, protocol, fail_at=(-3, 0), timeout_s=2)
    # THEN both process groups are killed at the limit (the parent does not hang), only the stuck one as timed out
    assert why == "a timed out" and 1.5 < took < 6
    assert [p.timed_out for p in probes] == [True, False]
    assert [p.proc.returncode for p in probes] == [-signal.SIGKILL, -signal.SIGKILL]


def test_a_child_whose_parent_is_gone_fails_instead_of_waiting_forever(tmp_path):
    # GIVEN FIFOs nobody holds open (the parent died before the child started)
    paths = {"go": str(tmp_path / "go"), "done": str(tmp_path / "done")}
    for path in paths.values():
        os.mkfifo(path)
    # WHEN the child joins  THEN it fails at once with the reason
    with pytest.raises(lockstep.LockstepError, match="parent process is gone"):
        lockstep.Baton(paths, 30)


def test_a_child_whose_parent_closes_the_channel_fails(tmp_path):
    # GIVEN a child that joined, WHEN the parent's ends close (the parent died)
    channel = lockstep._Channel(tmp_path, "a")
    baton = lockstep.Baton(channel.paths, 30)
    channel.close()
    # THEN waiting for the baton fails with the reason, without waiting
    with pytest.raises(lockstep.LockstepError, match="closed the lockstep channel"):
        baton.wait()


def test_outside_the_gate_a_probe_has_no_baton():
    baton = lockstep.baton(ProbeSpec(id="p", workload="x.py", settings={}))
    assert not baton.active and baton.wait() and baton.idle_s == 0 and baton.report() is None


def test_the_planners_duels_stop_once_the_ratio_settles_while_each_side_still_swings():
    # GIVEN step times that swing 40% with the machine's speed state, the candidate 1.2x slower in every state
    a = [0.01 * (1.4 if (i // 3) % 2 else 1.0) for i in range(20)]
    b = [1.2 * x for x in a]
    assert lockstep.wave_noise(a, 1) > 0.1 and lockstep.ratio_settled(a, b, 1)
    pair = bare_pair()
    pair.protocol = Protocol(min_steps=10, min_time_s=0.05, max_steps=200, max_time_s=10)
    pair.cap, pair.waves, pair.epochs, pair.window = 200, [1, 1], [0, 0], None
    # THEN the ratio rule (the planner's duels) has enough; the gate's rule (each side steady) keeps measuring
    pair.noise = "ratio"
    assert enough(pair, [a, b]) and not enough(pair, [a[:8], b[:8]])  # but never under the minimum steps
    pair.noise, pair.window = "each", None  # a new pair
    assert not enough(pair, [a, b])
    # AND below 4 whole loader waves the ratio is not trusted
    assert not lockstep.ratio_settled(a[:12], b[:12], 4)


def test_a_pair_with_loader_workers_measures_whole_epochs_of_both_sides():
    # GIVEN steady steps, a protocol met after 10 pairs, and sides with 16- and 32-step epochs (other batch sizes)
    steps = [0.01] * 100
    pair = bare_pair()
    pair.protocol = Protocol(min_steps=10, min_time_s=0.05, max_steps=200, max_time_s=10)
    pair.cap, pair.waves, pair.noise, pair.epochs, pair.window = 200, [2, 2], "each", [16, 32], None
    pair.deadline = time.monotonic() + 60
    # THEN the pair goes on to 32 steps, where each side's window holds whole epochs
    assert not enough(pair, [steps[:10], steps[:10]]) and not enough(pair, [steps[:31], steps[:31]])
    assert enough(pair, [steps[:32], steps[:32]])
    # AND without loader workers, 10 pairs are enough
    pair.epochs, pair.window = [0, 0], None
    assert enough(pair, [steps[:10], steps[:10]])


def test_a_pair_of_two_batch_sizes_goes_on_further_to_hold_both_sides_restarts():
    # GIVEN a duel of batch 32 against 128 with loader workers (epochs of 64 and 16 steps) whose larger side
    # reaches the 4 s cap after 40 steps, and whose common multiple of epochs, 64 steps, is projected at 6.4 s
    slow, fast = [0.1] * 100, [0.03] * 100
    pair = bare_pair()
    pair.protocol = Protocol(min_steps=10, min_time_s=0.5, max_steps=200, max_time_s=4.0)
    pair.cap, pair.waves, pair.noise, pair.epochs, pair.window = 200, [3, 3], "each", [64, 16], None
    pair.deadline = time.monotonic() + 60
    # THEN it measures the 64 steps (1.6x the cap, beyond EPOCH_ROUNDING_CAP): each side holds its share of restarts
    assert 4.0 * EPOCH_ROUNDING_CAP < 6.4
    assert not enough(pair, [fast[:42], slow[:42]]) and not enough(pair, [fast[:63], slow[:63]])
    assert enough(pair, [fast[:64], slow[:64]])
    # AND not where the steps to it would end after the probes' deadline (the budget's end)
    pair.window, pair.deadline = None, time.monotonic() + 10
    assert enough(pair, [fast[:42], slow[:42]])
    # AND sides whose epochs are the same length keep the usual bound: their restarts fall at the same steps
    pair.window, pair.epochs, pair.deadline = None, [64, 64], time.monotonic() + 60
    assert enough(pair, [slow[:42], slow[:42]])


def test_a_ratio_settles_when_it_is_precise_or_clearly_away_from_one():
    rng = np.random.default_rng(0)
    a = list(0.1 * (1 + rng.uniform(-0.1, 0.1, 400)))
    jitter = 1 + rng.uniform(-0.1, 0.1, 400)
    same = [x * j for x, j in zip(a, jitter)]  # equal speed, ±10% jitter per step on each side
    slower = [1.5 * x for x in same]
    assert not lockstep.ratio_settled(a[:10], same[:10], 1)  # ±10% jitter: 10 steps cannot pin it to ±4%
    assert lockstep.ratio_settled(a, same, 1)  # 400 can
    assert lockstep.ratio_settled(a[:10], slower[:10], 1)  # 1.5x is clear of 1 after 10


def test_a_ratio_of_steps_with_varying_work_settles_per_item():
    # GIVEN batches whose token counts vary 3x, unaligned between the sides (other batch sizes), and a candidate
    # 1.2x slower per token
    rng = np.random.default_rng(1)
    tokens = [list(rng.integers(100, 300, 30).astype(float)) for _ in range(2)]
    a = [1e-4 * n for n in tokens[0]]
    b = [1.2e-4 * n for n in tokens[1]]
    # THEN step times alone cannot tell; time per token can
    assert not lockstep.ratio_settled(a, b, 1)
    assert lockstep.ratio_settled(a, b, 1, items=tokens)


@pytest.mark.parametrize("first, first_takes_slot0, slots", [
    (0, False, [0, 1]), (1, False, [0, 1]),  # the gate: reference in slot 0, whoever moves first
    (0, True, [0, 1]), (1, True, [1, 0]),  # the planner's duels: the first mover takes slot 0
])
def test_which_zygote_slot_each_side_forks_from(tmp_path, monkeypatch, first, first_takes_slot0, slots):
    from tune_advisor.probe import runner
    from tune_advisor.probe.result import ProbeResult, Status

    started = []

    class Conducted:
        turns = [[], []]

        def __init__(self, probes, channels, noise, match_turns):
            pass

        def conduct(self, first):
            return "measured", None

        def close(self):
            pass

    def start_probe(spec, workdir, role, slot=0, ready_by=None):
        started.append((spec.id, slot))
        return SimpleNamespace(spec=spec, began=True, deadline=float("inf"))

    monkeypatch.setattr(lockstep, "_Pair", Conducted)
    monkeypatch.setattr(runner, "start_probe", start_probe)
    monkeypatch.setattr(runner, "finish_probe", lambda probe: ProbeResult(probe.spec.id, {}, Status.OK))
    specs = [ProbeSpec(id=name, workload="w.py", settings={}) for name in ("ref", "cand")]
    results = lockstep.run_pair(specs, tmp_path, ["r", "c"], first=first, first_takes_slot0=first_takes_slot0)
    assert started == [("ref", slots[0]), ("cand", slots[1])]
    assert [r.extra["lockstep"]["first"] for r in results] == [first == 0, first == 1]
