from tune_advisor import knobs
from tune_advisor.knobs import DeviceFacts, WorkloadFacts
from tune_advisor.planner import FirstPlanner, PlanContext, Session
from tune_advisor.probe.result import Status

from ..fakes import FakeClock, FakeRunner

CPU = DeviceFacts("cpu")
CNN = WorkloadFacts(conv_layers=4, repeated_blocks="blocks: 2 x Block", dataset_len=10_000)


def plan(rate, workload=CNN, search=None, baseline=None, budget_s=None, memory=None):
    runner, clock = FakeRunner(rate), FakeClock()

    def timed(probe_id, settings, role):
        result = runner(probe_id, settings, role)
        clock.now += result.wall_s
        return result

    session = Session(timed, budget_s, clock=clock)
    ctx = PlanContext(baseline=knobs.full_settings(baseline or {"batch_size": 16}), search=search or {},
                      workload=workload, device=CPU, memory_budget_bytes=memory)
    return FirstPlanner(ctx, session).run(), runner


def cnn_rate(s):
    """bf16 1.5x, channels_last 1.2x, throughput climbs with batch up to 64, OOM from 256, workers useless."""
    rate = 1000.0 * (1.5 if s["amp"] == "bf16" else 1) * (1.2 if s["channels_last"] else 1)
    rate *= (1.0, 1.4, 1.7, 1.7)[min(3, [16, 32, 64, 128].index(s["batch_size"]))] if s["batch_size"] < 256 else 1
    if s["batch_size"] >= 256:
        return Status.OOM
    if s["checkpointing"]:
        rate *= 0.7
    return rate


def test_combines_every_real_gain_and_confirms_it():
    outcome, _ = plan(cnn_rate)
    rec = outcome.recommended.settings
    assert rec["amp"] == "bf16" and rec["channels_last"] is True and rec["batch_size"] == 64
    assert rec["num_workers"] == 0 and rec["checkpointing"] is False
    # 1.5 * 1.2 * 1.7 = 3.06x, re-measured interleaved
    assert 2.9 < outcome.speedup["median"] < 3.2 and outcome.speedup["ci_low"] > 2.8
    roles = [p.role for p in outcome.probes]
    assert roles[-4:] == ["confirm:baseline", "confirm:recommended"] * 2


def test_not_applicable_knobs_are_skipped_with_their_reason_not_run():
    outcome, runner = plan(cnn_rate)
    skipped = {knobs.describe(p.settings, outcome.baseline.settings): p.error
               for p in outcome.probes if p.status is Status.SKIPPED}
    assert "no CUDA device" in skipped["pin_memory=true"]
    assert "no CUDA device" in skipped["cudnn_benchmark=true"]
    assert "fp16" in skipped["amp=fp16"]
    assert not any(c["pin_memory"] for c in runner.calls)


def test_batch_ladder_stops_at_the_first_failure_and_never_recommends_it():
    outcome, runner = plan(cnn_rate)
    tried = sorted({c["batch_size"] for c in runner.calls})
    assert 256 in tried and 512 not in tried  # stopped at the first OOM
    assert outcome.recommended.settings["batch_size"] < 256


def test_batch_ladder_stops_on_a_plateau():
    outcome, runner = plan(lambda s: 1000.0 * min(s["batch_size"], 32) / 16 if s["batch_size"] < 4096 else 1.0)
    tried = sorted({c["batch_size"] for c in runner.calls})
    assert tried[:4] == [16, 32, 64, 128] and 512 not in tried  # two steps without gain, then stop
    assert outcome.recommended.settings["batch_size"] == 32
    assert any("past the throughput plateau" in u for u in outcome.unexplored)


def test_worker_ladder_finds_the_knee_of_an_io_bound_loader():
    def io_rate(s):
        return 100.0 * min(1 + s["num_workers"], 6)  # gains until 5 workers, flat after

    outcome, _ = plan(io_rate, workload=WorkloadFacts(dataset_len=10_000), baseline={"batch_size": 4096})
    assert outcome.recommended.settings["num_workers"] == 8  # the first ladder value at the plateau
    assert outcome.speedup["median"] > 5


def test_a_one_percent_gain_is_noise_and_not_recommended():
    outcome, _ = plan(lambda s: 1000.0 * (1.01 if s["amp"] == "bf16" else 1.0), workload=WorkloadFacts(),
                      search={"batch_size": [16]})
    assert outcome.recommended.settings == outcome.baseline.settings
    assert outcome.speedup is None


def test_a_failing_baseline_ends_the_plan_with_a_note():
    outcome, runner = plan(lambda s: Status.DIVERGED)
    assert len(runner.calls) == 1 and outcome.recommended is outcome.baseline
    assert "baseline probe failed (diverged)" in outcome.notes[0]


def test_budget_stops_probing_and_lists_what_was_left():
    # 5 s per probe, 30 s budget: the baseline and a few probes, keeping room for the confirmation
    outcome, runner = plan(cnn_rate, budget_s=30)
    assert len(runner.calls) <= 6
    assert any("over budget" in u for u in outcome.unexplored)


def test_memory_budget_stops_the_batch_ladder():
    outcome, runner = plan(cnn_rate, memory=40 * 2**20)  # the fake peak is batch_size MiB
    assert max(c["batch_size"] for c in runner.calls) == 64
    assert any("memory budget" in n for n in outcome.notes)


def test_channels_last_that_pays_only_under_amp_is_tried_with_the_amp_winner():
    def rate(s):
        bf16 = s["amp"] == "bf16"
        return 1000.0 * (1.6 if bf16 else 1) * (1.3 if bf16 and s["channels_last"] else 1)

    outcome, runner = plan(rate, search={"batch_size": [16], "num_workers": [0]})
    assert outcome.recommended.settings["channels_last"] is True and outcome.recommended.settings["amp"] == "bf16"
    assert {"amp": "bf16", "channels_last": True}.items() <= runner.calls[-5].items()  # the partner probe
