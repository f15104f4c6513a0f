"""Device-time lockstep and what pin_memory is judged by, on the fake CUDA timeline of tests/fakes.py (FakeCuda: a
simulated host and GPU whose events complete in stream order): a lockstep side keeps one step in flight inside its
turn and reads the GPU's time; a loop whose copies overlap the host's work reads faster; the planner keeps
pin_memory where that overlap pays, drops it where it does not, and compares it one after the other on steps the
host clock paces. Times here are the fake timeline's milliseconds, not measurements."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tune_advisor import knobs, snippets
from tune_advisor.knobs import DeviceFacts, WorkloadFacts
from tune_advisor.planner import PlanContext, Session, plan
from tune_advisor.probe import device_clock, lockstep
from tune_advisor.probe.spec import ProbeSpec, Protocol
from tune_advisor.rules import evaluate

from ..fakes import FakeClock, FakeCuda, FakeGpu, FakeLoop, TimelineBackend
from .test_lockstep import FakeProbe, run_pair

GPU = DeviceFacts("cuda", tf32=True)
HOST_BOUND = (8.0, 4.0, 4.0)  # fetch, copy, compute (ms): the host's fetch is the long pole, a copy can hide
COPY_BOUND = (1.0, 10.0, 1.0)  # the copy is the step: nothing to hide it behind


def side(gpu: FakeGpu, fetch_ms: float, copy_ms: float, compute_ms: float, pinned: bool) -> FakeLoop:
    """A lockstep side on `gpu`: its own process (stream), its clock as probe/training.py picks it."""
    cuda = FakeCuda(gpu)
    clock = device_clock.for_probe("cuda", cuda, host_paced=False, lockstep=True)
    return FakeLoop(cuda, clock, fetch_ms, copy_ms, compute_ms, pinned)


def in_lockstep(a: FakeLoop, b: FakeLoop, turns: int = 12, steps: int = lockstep.DEVICE_TURN_STEPS,
                drain: bool = True) -> list[float]:
    """The two sides' mean step (ms) over `turns` turns each of `steps` steps, A B B A as the parent hands the
    baton, each turn's last step waited for (`drain`, as the parent's b"l" asks) or left in flight."""
    order, lines = (a, b), {id(a): 0, id(b): 0}
    for _ in range(turns):
        for loop in order:
            for i in range(steps):
                loop.step(drain=drain and i == steps - 1)
                lines[id(loop)] += 1
        order = order[::-1]
    means = []
    for loop in (a, b):
        loop.steps += loop.clock.flush()
        assert len(loop.steps) == lines[id(loop)] and loop.cuda.device_syncs == 0
        means.append(sum(s.seconds for s in loop.steps) / len(loop.steps) * 1000)
    return means


# --- the clock of a lockstep side ---------------------------------------------------------------------------------


def test_a_lockstep_side_keeps_one_step_in_flight_inside_its_turn_and_waits_for_its_last_one():
    loop = side(FakeGpu(), *HOST_BOUND, pinned=True)
    cuda = loop.cuda
    # WHEN it takes a turn of four steps
    handed = [loop.step() for _ in range(3)]
    in_flight = cuda.stream_ms > cuda.gpu.host_ms  # the third step still running when the baton went back
    handed.append(loop.step(drain=True))
    # THEN each line hands over the step before (none after the first), the last line that step and the last
    assert [[f.step for f in line] for line in handed] == [[], [0], [1], [2, 3]]
    assert in_flight and cuda.gpu.host_ms >= cuda.stream_ms  # the turn ends with nothing left on the GPU
    # AND only the steps' own events were waited for, never the whole device
    assert cuda.device_syncs == 0 and cuda.event_waits == 4
    # AND the steps read the GPU's time: the first from its baton (fetch, copy, compute), the rest overlapped
    assert [f.seconds * 1000 for line in handed for f in line] == pytest.approx([16.0, 8.0, 8.0, 8.0])


def test_lockstep_reads_each_side_s_gpu_time_not_its_partner_s_turn():
    # GIVEN two sides of 10 ms and 5 ms of compute on one GPU (1 ms fetch, 1 ms pageable copy)
    gpu = FakeGpu()
    a_ms, b_ms = in_lockstep(side(gpu, 1, 1, 10, False), side(gpu, 1, 1, 5, False))
    # THEN each reads its own steps (11 and 6 ms once one is in flight; a turn's first 12 and 7), the partner's
    # turn never counted
    steps = lockstep.DEVICE_TURN_STEPS
    assert (a_ms, b_ms) == pytest.approx(((12 + 11 * (steps - 1)) / steps, (7 + 6 * (steps - 1)) / steps))


def test_a_step_left_in_flight_across_the_partner_s_turn_would_blur_the_pair():
    # The reason a turn's last step is waited for: left running, the partner's kernels queue behind it on the GPU
    # and each side reads part of the other's work
    gpu = FakeGpu()
    drained = in_lockstep(side(gpu, 1, 1, 10, False), side(gpu, 1, 1, 5, False))
    gpu = FakeGpu()
    blurred = in_lockstep(side(gpu, 1, 1, 10, False), side(gpu, 1, 1, 5, False), steps=1, drain=False)
    assert drained[0] / drained[1] > 1.75 and blurred[0] / blurred[1] < 1.25  # 11/6 alone: 1.83


def test_a_loop_that_overlaps_its_copies_reads_faster_than_one_that_does_not():
    # GIVEN a step whose host fetch (8 ms) is longer than its copy and compute (4 + 4 ms)
    alone = {}
    for pinned in (False, True):
        cuda = FakeCuda()
        loop = FakeLoop(cuda, device_clock.CudaEventClock(cuda), *HOST_BOUND, pinned=pinned)
        steps = loop.run(20)[1:]  # the first step has no step before it to overlap
        copies = device_clock.overlap([ms / 1000 for ms in loop.host_copy_ms[1:]], [s.copy_s for s in steps])
        alone[pinned] = (sum(s.seconds for s in steps) / len(steps) * 1000, copies["overlap_frac"])
    # THEN alone, pinned + non_blocking copies the host does not wait for read 8 ms a step, pageable ones 12 ms
    assert alone == {False: pytest.approx((12.0, 0.0)), True: pytest.approx((8.0, 1.0))}
    # AND in device-time lockstep the pinned side reads faster too (a turn's first step has nothing to overlap)
    gpu = FakeGpu()
    pageable, pinned = in_lockstep(side(gpu, *HOST_BOUND, False), side(gpu, *HOST_BOUND, True))
    assert pageable / pinned > 1.3
    # AND steps each waited for before the next (the host clock's pacing) read them the same: the gain measured away
    gpu = FakeGpu()
    paced = in_lockstep(side(gpu, *HOST_BOUND, False), side(gpu, *HOST_BOUND, True), steps=1)
    assert paced == pytest.approx([16.0] * 2)


def test_device_sides_take_turns_of_several_steps_keeping_the_ratio_of_matched_turns():
    assert lockstep.device_turns([1, 1]) == [8, 8]
    assert lockstep.device_turns([1, 5]) == [8, 40]  # matched turns: a side of 5x shorter steps, 5x as many
    assert lockstep.device_turns([25, 1], timed=True) == [25, 8]  # timed turns: each side at least the minimum


# --- the protocol: a side that keeps a step in flight ---------------------------------------------------------------

# A child as probe/training.py runs a GPU side: "ready" with one step in flight, each line the step before (none
# after a turn's first), the turn's last step (b"l") handed over with it; it records where its turns ended.
CHILD = """
import json, sys, time
from tune_advisor.probe.lockstep import Baton

paths, step_s, report = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
baton = Baton(paths, 30)
baton.begin(None, 1, 1)
pending, lasts, n = None, [], 0
while baton.wait():
    n += 1
    time.sleep(step_s)
    figures = [pending] if pending is not None else []
    pending = (step_s, 2.0)
    if baton.last:
        figures, pending = figures + [pending], None
        lasts.append(n)
    baton.hand_over(figures)
with open(report, "w") as f:
    json.dump({**baton.report(), "lasts": lasts}, f)
"""


def test_a_pair_of_gpu_sides_takes_turns_of_several_steps_each_ending_on_a_last_step(tmp_path: Path):
    protocol = Protocol(min_steps=20, min_time_s=0, max_steps=200, max_time_s=10)
    channels, children = [], []
    for name in "ab":
        channels.append(lockstep._Channel(tmp_path, name))
        spec = ProbeSpec(id=name, workload="", settings={"num_workers": 0}, protocol=protocol, timeout_s=30)
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(channels[-1].paths), "0.001",
                                 str(tmp_path / f"{name}.json")], start_new_session=True)
        children.append(FakeProbe(spec, proc))
    why, pair = run_pair(channels, children)
    reports = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in "ab"}
    # THEN the pair measured in turns of DEVICE_TURN_STEPS, each turn's last step marked as such
    assert why == "measured" and pair.device
    for side_turns, name in zip(pair.turns, "ab"):
        assert set(side_turns) == {lockstep.DEVICE_TURN_STEPS} and len(side_turns) >= 3
        ends = [sum(side_turns[:i + 1]) for i in range(len(side_turns))]
        assert reports[name]["lasts"] == ends and reports[name]["steps"] == sum(side_turns)


# --- the planner: pin_memory kept where its overlap pays ---------------------------------------------------------


def plan_pinning(timeline, step_clock: str = device_clock.DEVICE):
    """A grid over pin_memory on a GPU whose probes run on the fake timeline (TimelineBackend), lockstep allowed."""
    clock = FakeClock()
    backend = TimelineBackend(lambda settings: timeline, step_clock=step_clock, clock=clock, can_pair=True)
    ctx = PlanContext(baseline=knobs.full_settings({"batch_size": 16}), search={"pin_memory": [False, True]},
                      workload=WorkloadFacts(dataset_len=10_000), device=GPU)
    return plan(ctx, Session(backend, None, clock=clock), "grid"), backend


def test_pin_memory_is_kept_where_its_copies_overlap_the_host_s_work_compared_in_device_time_lockstep():
    outcome, backend = plan_pinning((*HOST_BOUND, None))
    assert outcome.recommended.settings["pin_memory"] is True
    # its contribution, the recommendation's only change, measured by the confirmation in lockstep on the GPU's clock
    assert backend.pairs and "in lockstep" in outcome.speedup["method"]
    assert any("pin_memory=true is the only change left" in d for d in outcome.decisions)
    assert not any("in_turn" in p.extra for p in outcome.probes)


@pytest.mark.parametrize("timeline", [(*COPY_BOUND, None), (*HOST_BOUND, False)], ids=["copy-bound", "no-overlap"])
def test_pin_memory_is_dropped_where_its_copies_hide_behind_nothing(timeline):
    # copy-bound: the host does not wait for pinned copies, but nothing else is left to run beside them;
    # no-overlap: pinned pages copied without non_blocking, the host waits as for pageable ones (overlap 0)
    outcome, _ = plan_pinning(timeline)
    assert outcome.recommended.settings["pin_memory"] is False
    assert any("pin_memory=true: within noise, so the baseline stays recommended" in n for n in outcome.notes)


def test_pin_memory_on_steps_the_host_clock_paces_is_compared_one_after_the_other_and_says_so():
    # GIVEN steps each waited for before the next (a framework's own loop synchronises every step)
    outcome, backend = plan_pinning((*HOST_BOUND, None), step_clock=device_clock.HOST_SYNCED)
    # THEN no pin_memory comparison ran in lockstep, each one-after-the-other probe says why, and the waiting
    # measured the overlap away: dropped
    assert backend.pairs == []
    compared = [p for p in outcome.probes if p.role.startswith(("ablate", "confirm")) and ":alone:" not in p.role]
    assert compared and all("host clock" in p.extra["in_turn"] for p in compared)
    assert outcome.recommended.settings["pin_memory"] is False


# --- what the report says: the overlap in TA104, non_blocking in the code to apply ------------------------------------


def test_ta104_quotes_the_copies_overlap_on_each_side():
    golden = Path(__file__).resolve().parents[1] / "golden" / "rules" / "synthetic_cuda_untuned.results.json"
    doc = json.loads(golden.read_text())
    (silent,) = evaluate(copy.deepcopy(doc), select=["TA104"])  # probes without event-clock copy figures
    assert "overlap" not in silent["message"]
    for probe in doc["probes"]:
        pinned = probe["settings"]["pin_memory"]
        probe.setdefault("extra", {})["h2d"] = {"overlap_frac": 0.95 if pinned else 0.0, "clock": "cuda events"}
    (finding,) = evaluate(doc, select=["TA104"])
    assert "(the copies' overlap with the host's work: pageable 0%, pinned 95%)" in finding["message"]
    assert finding["evidence"]["pageable_overlap_frac"] == 0.0 and finding["evidence"]["pinned_overlap_frac"] == 0.95


def test_the_code_to_apply_pin_memory_copies_with_non_blocking():
    pinned = snippets.recommended(knobs.full_settings({"pin_memory": True}))
    assert "pin_memory=True" in pinned and "non_blocking=True" in pinned
    assert "non_blocking" not in snippets.recommended(knobs.full_settings({}))


# --- script mode: the user's own loop, timed by the same clock -------------------------------------------------------


class ScriptHooks:
    """What script/driver.py Steps reads of its hooks, for a script whose steps run on a FakeCuda: each optimizer
    step queues `compute_ms` of kernels after the host's `fetch_ms`, its loss a tensor on the fake GPU."""

    def __init__(self, cuda: FakeCuda, losses: list[float], fetch_ms: float = 8.0, compute_ms: float = 10.0):
        self.cuda, self.losses, self.fetch_ms, self.compute_ms = cuda, list(losses), fetch_ms, compute_ms
        self.train_loader, self.applied, self.loss = None, {}, None
        self.fetch_wall_s = self.fetch_cpu_s = 0.0

    def train_step(self) -> None:
        self.cuda.host(self.fetch_ms)
        self.cuda.kernel(self.compute_ms)
        self.loss = self.cuda.loss(self.losses.pop(0))

    def take_step_input(self):
        return 0.001, 8.0, False, 1

    def read_loss(self):
        raise AssertionError("reading the loss now would wait for the GPU every step")


def script_steps(losses, protocol: Protocol):
    from tune_advisor.probe import evidence
    from tune_advisor.script import driver

    cuda = FakeCuda()
    out = {"raw": evidence.empty_raw(), "extra": {}}
    spec = ProbeSpec(id="p", workload="train.py", settings=knobs.full_settings(), protocol=protocol, device="cuda")
    steps = driver.Steps(spec, out, lambda text: None, "cuda")
    steps.hooks = ScriptHooks(cuda, losses)
    steps.clock = device_clock.CudaEventClock(cuda)  # as `_clock` picks it where the script set CUDA up
    return steps, out, cuda


def run_script(steps, calls: int):
    from tune_advisor.script.hooks import ScriptStop

    with pytest.raises(ScriptStop) as stopped:
        for _ in range(calls):
            steps.hooks.train_step()
            steps(None)
    return stopped.value


def test_script_mode_times_the_optimizer_steps_by_events_without_a_synchronize_every_step():
    protocol = Protocol(warmup_steps=2, min_steps=6, min_time_s=0.0, max_steps=6, max_time_s=60.0)
    steps, out, cuda = script_steps([1.0] * 20, protocol)
    stopped = run_script(steps, 20)
    # THEN the stop rule stopped at six steps read, and the two still on the GPU were measured too, each the GPU's
    # time between two optimizer steps' ends: the host's 8 ms fetch hidden behind the previous step's 10 ms of
    # kernels, but for the first, which began on a GPU the warm-up's last step had left idle (8 + 10 ms)
    assert stopped.kind == "done" and out["raw"]["loss_step"] == list(range(2, 10))
    assert out["raw"]["step_s"] == pytest.approx([0.018] + [0.010] * 7)
    # AND nothing synchronised the device; the host waited only on steps' end events
    assert cuda.device_syncs == 0 and cuda.event_waits == 10


def test_script_mode_reads_a_non_finite_loss_when_the_gpu_has_run_its_step():
    protocol = Protocol(warmup_steps=2, min_steps=50, min_time_s=0.0, max_steps=50, max_time_s=60.0)
    steps, out, _ = script_steps([1.0] * 4 + [float("nan")] * 6, protocol)
    stopped = run_script(steps, 10)
    # the fifth optimizer step's loss was NaN: seen once the host was LAG steps ahead, and named by its own step
    assert stopped.kind == "diverged" and "optimizer step 5" in stopped.message
    assert out["raw"]["loss"][-1] is None and out["raw"]["loss_step"][-1] == 4
