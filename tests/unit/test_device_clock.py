"""Timing GPU steps without synchronising every step, against a fake torch.cuda whose events carry a simulated GPU
timeline: steps are read LAG steps late, their time is the GPU's, and a copy the host did not wait for shows."""

from __future__ import annotations

import math

import pytest

from tune_advisor.probe import device_clock


class FakeTimeline:
    """The GPU: `now` is its clock in ms; an event records the time the stream reaches it."""

    def __init__(self):
        self.now = 0.0
        self.synchronized: list = []

    def Event(self, enable_timing=False):
        timeline = self

        class Event:
            def record(self):
                self.at = timeline.now

            def synchronize(self):
                timeline.synchronized.append(self)

            def elapsed_time(self, other):
                return other.at - self.at

        assert enable_timing
        return Event()

    def synchronize(self):
        self.synchronized.append("device")


class Loss:
    def __init__(self, value):
        self.value = value

    def detach(self):
        return self

    def float(self):
        return self

    def item(self):
        return self.value


def run_steps(clock, gpu, steps, copy_ms=2.0, compute_ms=10.0):
    """Each step: a copy of `copy_ms`, then compute of `compute_ms` on the GPU timeline."""
    finished = []
    for step in range(steps):
        clock.copy_start()
        gpu.now += copy_ms
        clock.copy_end()
        gpu.now += compute_ms
        finished += clock.end(step, Loss(2.0 - 0.1 * step), t0=0.0)
    return finished


def test_gpu_steps_are_read_lag_steps_late_with_the_gpu_s_own_times():
    gpu = FakeTimeline()
    clock = device_clock.CudaEventClock(gpu, lag=2)
    # GIVEN 5 steps of a 2 ms copy and 10 ms of compute
    finished = run_steps(clock, gpu, 5)
    # THEN the host got the first 3 back while the last 2 were still in flight, with nothing synchronised
    # but the steps it read; then the rest when flushed
    assert [f.step for f in finished] == [0, 1, 2] and "device" not in gpu.synchronized
    finished += clock.flush()
    assert [f.step for f in finished] == [0, 1, 2, 3, 4]
    # AND each step's time is the GPU timeline from the previous step's end (the first: from its copy)
    assert [f.seconds for f in finished] == pytest.approx([0.012] * 5)
    assert [f.copy_s for f in finished] == pytest.approx([0.002] * 5)
    assert [f.loss for f in finished] == pytest.approx([2.0, 1.9, 1.8, 1.7, 1.6])


def test_a_gpu_idle_waiting_for_data_counts_in_the_step():
    gpu = FakeTimeline()
    clock = device_clock.CudaEventClock(gpu, lag=0)
    run_steps(clock, gpu, 1)
    gpu.now += 30.0  # the host took 30 ms to fetch the next batch: the GPU sat idle
    (late,) = run_steps(clock, gpu, 1)
    assert late.seconds == pytest.approx(0.042)


def test_sync_returns_every_step_at_once():
    gpu = FakeTimeline()
    clock = device_clock.CudaEventClock(gpu, lag=2)
    clock.copy_start()
    clock.copy_end()
    assert [f.step for f in clock.end(0, Loss(1.0), 0.0, sync=True)] == [0]


def test_a_lockstep_side_on_a_gpu_times_its_steps_by_events_one_in_flight_only_ddp_keeps_the_host_clock():
    gpu = FakeTimeline()
    assert isinstance(device_clock.for_probe("cpu", None, host_paced=False, lockstep=True), device_clock.HostClock)
    # GIVEN a lockstep side on a GPU: CUDA events, one step in flight, each step timed from its baton
    side = device_clock.for_probe("cuda", gpu, host_paced=False, lockstep=True)
    assert isinstance(side, device_clock.CudaEventClock) and side.lag == 1 and side.paced
    assert side.name == device_clock.DEVICE
    # WHEN it runs two steps, its baton coming 50 ms after the first ended (the partner's turn)
    side.begin()
    gpu.now += 12.0
    assert side.end(0, Loss(1.5), t0=0.0) == []  # in flight: nothing to hand over yet
    gpu.now += 50.0
    side.begin()
    gpu.now += 12.0
    (first,) = side.end(1, Loss(1.4), t0=0.0)
    (second,) = side.flush()
    # THEN each step is its own 12 ms from its baton, the partner's turn not counted, nothing synchronised the device
    assert (first.step, second.step) == (0, 1) and [first.seconds, second.seconds] == pytest.approx([0.012] * 2)
    assert "device" not in gpu.synchronized
    # AND DDP ranks keep the host clock, synchronised every step
    paced = device_clock.for_probe("cuda", gpu, host_paced=True, lockstep=False)
    assert isinstance(paced, device_clock.HostClock) and paced.name == device_clock.HOST_SYNCED
    (done,) = paced.end(0, Loss(1.5), t0=0.0)
    assert done.loss == 1.5 and done.copy_s is None and gpu.synchronized[-1] == "device"
    free = device_clock.for_probe("cuda", gpu, host_paced=False)
    assert isinstance(free, device_clock.CudaEventClock) and free.lag == device_clock.LAG and not free.paced


def test_the_overlap_says_how_much_of_the_copies_the_host_did_not_wait_for():
    # GIVEN 2 ms copies on the device: pinned + non_blocking, the host spends 0.1 ms in the call; pageable, 2 ms
    pinned = device_clock.overlap([0.0001] * 4, [0.002] * 4)
    pageable = device_clock.overlap([0.002] * 4, [0.002] * 4)
    assert pinned["overlap_frac"] == pytest.approx(0.95) and pageable["overlap_frac"] == pytest.approx(0.0)
    assert pinned["device_copy_s"] == pytest.approx(0.002)
    # AND the host clock (no device copy times) gives none
    assert device_clock.overlap([0.001], [None]) is None
    assert not math.isnan(pinned["host_wait_s"])


class TickingTimeline(FakeTimeline):
    """A GPU whose clock moves 1 ms with every event, so each step takes a few ms on it."""

    def Event(self, enable_timing=False):
        event = super().Event(enable_timing)
        record = event.record

        def ticking():
            self.now += 1.0
            record()

        event.record = ticking
        return event


def test_a_training_run_timed_on_a_lagging_device_clock_keeps_every_measured_step_in_order(monkeypatch):
    # GIVEN a CPU probe whose steps are timed as a GPU's would be (a fake event clock, two steps of lag)
    from tune_advisor import knobs
    from tune_advisor.child import train_and_measure
    from tune_advisor.probe.spec import ProbeSpec

    from ..conftest import FAST, WORKLOADS

    monkeypatch.setattr(device_clock, "for_probe",
                        lambda device_type, cuda, host_paced, lockstep=False:
                        device_clock.CudaEventClock(TickingTimeline(), lag=2))
    spec = ProbeSpec(id="p1", workload=str(WORKLOADS / "tiny_mlp.py"), settings=knobs.full_settings({"batch_size": 16}),
                     device="cpu", protocol=FAST)
    out = train_and_measure(spec, lambda text: None)
    # THEN it measured, every step's figures in their lists in step order, the in-flight ones flushed at the end
    raw = out["raw"]
    assert out["status"] == "ok", out["error"]
    n = len(raw["step_s"])
    assert n >= FAST.min_steps and all(len(raw[k]) == n for k in ("items", "loss", "loss_step", "h2d_s"))
    assert raw["loss_step"] == list(range(raw["loss_step"][0], raw["loss_step"][0] + n))
    assert all(s == pytest.approx(0.003) for s in raw["step_s"])  # three events a step, 1 ms apart
    h2d = out["extra"]["h2d"]
    assert h2d["clock"] == "cuda events" and h2d["device_copy_s"] == pytest.approx(0.001)
