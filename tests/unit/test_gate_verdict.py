"""The verdict logic on synthetic rounds: effect size AND significance, drift between jobs, interleaved pairs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tune_advisor.gate import verdict
from tune_advisor.gate.checks import ERROR, FAIL, PASS, WARN, parse_check
from tune_advisor.gate.verdict import INTERLEAVED, STORED, Evidence, Round, Sample

BATCH = 16.0


def side(rate: float, *, rounds: int = 3, steps: int = 40, noise: float = 0.02, levels=None, memory=300 * 2**20,
         seed: int = 0) -> Sample:
    """`rounds` rounds at `rate` items/s: each round's level scaled by `levels[i]` (drift), steps jittered by
    `noise`, every step a batch of 16."""
    rng = np.random.default_rng(seed)
    levels = levels or [1.0] * rounds
    mems = memory if isinstance(memory, (list, tuple)) else [memory] * rounds
    return Sample([Round(list(BATCH / rate * level * (1 + rng.normal(0, noise, steps))), [BATCH] * steps, mem)
                   for level, mem in zip(levels, mems)])


def judge(text: str, candidate: Sample, reference: Sample | None = None, mode: str | None = STORED):
    return parse_check(text).evaluate(Evidence(candidate, reference, mode if reference else None))


def test_no_change_passes():
    # GIVEN two sides at the same rate with 2% step noise  WHEN throughput:5% judges them
    outcome = judge("throughput:5%", side(1000, seed=1), side(1000, seed=2))
    # THEN it passes and shows the ratio with its CI
    assert outcome.status == PASS, outcome.message
    assert "ratio 1.0" in outcome.message and "95% CI" in outcome.message
    assert outcome.failure is None


def test_a_15_percent_slowdown_fails_with_the_numbers():
    # GIVEN the candidate 15% slower (throughput x 1/1.15)  WHEN throughput:5% judges it
    outcome = judge("throughput:5%", side(1000 / 1.15, seed=1), side(1000, seed=2))
    # THEN it fails, saying by how much it dropped, against what, and with which interval
    assert outcome.status == FAIL
    assert outcome.failure.startswith("throughput dropped 1") and "(allowed 5%)" in outcome.failure
    assert "samples/s vs 1,0" in outcome.failure and "widened by the" in outcome.failure
    assert "over 3 rounds against 3 stored" in outcome.failure
    assert outcome.figures["ratio"]["median"] == pytest.approx(1 / 1.15, abs=0.01)
    assert outcome.figures["ratio"]["ci_high_widened"] < 0.95


def test_a_real_but_small_slowdown_below_the_threshold_passes():
    # GIVEN a 3% slowdown measured precisely (significant, but smaller than allowed)
    outcome = judge("throughput:5%", side(970, noise=0.005, seed=1), side(1000, noise=0.005, seed=2),
                    mode=INTERLEAVED)
    # THEN the effect-size condition keeps the gate green
    assert outcome.status == PASS, outcome.message
    assert outcome.figures["ratio"]["ci_high"] < 1  # it *was* significant


def test_a_large_drop_that_noise_explains_is_only_a_warning():
    # GIVEN an 8% lower median but rounds that scatter ±15% (a shared runner)
    candidate = side(920, levels=[0.85, 1.0, 1.15], seed=1)
    reference = side(1000, levels=[1.15, 1.0, 0.85], seed=2)
    # WHEN throughput:5% judges it against a stored baseline
    outcome = judge("throughput:5%", candidate, reference)
    # THEN it is not a failure: the CI widened by the run-to-run spread reaches past the threshold
    assert outcome.status == WARN, outcome.message
    assert "not significantly" in outcome.message and "run-to-run spread" in outcome.message


def test_interleaved_pairs_cancel_drift_that_a_stored_comparison_cannot():
    # GIVEN a 10% slowdown, measured in pairs that share a drifting machine (±12% from pair to pair)
    drift = [0.88, 1.0, 1.12, 0.95]
    candidate = side(900, rounds=4, levels=drift, noise=0.01, seed=1)
    reference = side(1000, rounds=4, levels=drift, noise=0.01, seed=2)
    # WHEN judged as interleaved pairs, and as if the reference were a stored baseline from another job
    paired = judge("throughput:5%", candidate, reference, mode=INTERLEAVED)
    stored = judge("throughput:5%", candidate, reference, mode=STORED)
    # THEN pairing sees the regression through the drift; the stored comparison must not claim it
    assert paired.status == FAIL, paired.message
    assert stored.status != FAIL, stored.message


def test_one_pair_straddling_a_machine_speed_change_does_not_decide_the_interleaved_verdict():
    # GIVEN no change, in 5 pairs; in one pair the machine sped up 30% between the reference and candidate rounds
    candidate = side(1000, rounds=5, levels=[1.0, 1.0, 1.3, 1.0, 1.0], noise=0.01, seed=1)
    reference = side(1000, rounds=5, levels=[1.0, 1.0, 1.0, 1.0, 1.0], noise=0.01, seed=2)
    # WHEN judged interleaved
    outcome = judge("throughput:5%", candidate, reference, mode=INTERLEAVED)
    # THEN the verdict follows the four agreeing pairs: no change
    assert outcome.status == PASS, outcome.message
    assert outcome.figures["ratio"]["median"] == pytest.approx(1.0, abs=0.02)
    # AND a real 15% slowdown with the same straddling pair still fails
    slowed = side(1000 / 1.15, rounds=5, levels=[1.0, 1.0, 1.3, 1.0, 1.0], noise=0.01, seed=3)
    assert judge("throughput:5%", slowed, reference, mode=INTERLEAVED).status == FAIL


def lockstep_pair(rate_ratio: float, *, pairs: int = 3, steps: int = 40, seed: int = 0) -> tuple[Sample, Sample]:
    """Pairs measured in lockstep on a machine that switches between speed states 30% apart every few steps:
    step k of both sides ran in the same state. Returns (candidate, reference)."""
    rng = np.random.default_rng(seed)
    sides = ([], [])
    for _ in range(pairs):
        state = np.repeat(rng.choice([1.0, 1.3], size=steps // 4 + 1), 4)[:steps]  # a state lasts 4 steps
        for rounds, rate in zip(sides, (1000 * rate_ratio, 1000)):
            rounds.append(Round(list(BATCH / rate * state * (1 + rng.normal(0, 0.01, steps))), [BATCH] * steps))
    return Sample(sides[0]), Sample(sides[1])


def test_lockstep_pairs_resample_their_steps_together_so_the_shared_machine_state_cancels():
    # GIVEN lockstep pairs on a machine whose speed jumps 30% every few steps, the candidate 10% slower
    candidate, reference = lockstep_pair(1 / 1.1)
    # WHEN judged interleaved  THEN the state both sides shared cancels: a tight interval around 0.909, a failure
    outcome = judge("throughput:5%", candidate, reference, mode=INTERLEAVED)
    ratio = outcome.figures["ratio"]
    assert outcome.status == FAIL, outcome.message
    assert ratio["median"] == pytest.approx(1 / 1.1, abs=0.01) and ratio["ci_high"] - ratio["ci_low"] < 0.05
    # AND resampled independently (as rounds that did not run side by side), the same steps could not prove it
    apart = verdict.ratio_interval(candidate, Sample(reference.rounds), "throughput", STORED)
    assert apart.high - apart.low > 0.1
    # AND without a change the same machine passes
    assert judge("throughput:5%", *lockstep_pair(1.0, seed=1), mode=INTERLEAVED).status == PASS


def test_a_stored_comparison_needs_the_whole_widened_interval_beyond_the_threshold():
    # GIVEN a 7% drop with a 4% run-to-run spread: the median is past 5%, the widened CI is not
    candidate = side(930, levels=[0.98, 1.0, 1.02], noise=0.005, seed=1)
    reference = side(1000, levels=[0.98, 1.0, 1.02], noise=0.005, seed=2)
    outcome = judge("throughput:5%", candidate, reference)
    # THEN stored mode warns instead of failing
    assert outcome.status == WARN, outcome.message
    assert outcome.figures["ratio"]["allowance"] == pytest.approx(0.04, abs=0.01)


def test_a_side_carries_one_level_in_every_check():
    # GIVEN interleaved rounds whose candidate read 900, 1,000 and 1,300 samples/s (mean 1,067; the ratios' centre,
    # the median of their pairwise geometric means, 1.040x)
    candidate = side(1000, levels=[1 / 0.9, 1.0, 1 / 1.3], noise=0.0)
    evidence = Evidence(candidate, side(1000, noise=0.0, seed=2), INTERLEAVED)
    # WHEN a relative and a bound check judge the same evidence
    relative = parse_check("throughput:5%").evaluate(evidence)
    bound = parse_check("throughput:>=500").evaluate(evidence)
    # THEN both print the candidate at the one level, saying what it is and what the ratio pairs
    shown = f"{evidence.level('throughput').median:,.0f} samples/s"
    assert shown != "1,000 samples/s" and bound.message.startswith(f"throughput within the limit: {shown}")
    assert f"levels {shown} vs 1,000 samples/s (each side's mean over its rounds)" in relative.message
    assert "ratio 1.040x over 3 paired rounds" in relative.message
    assert relative.figures["candidate"] == pytest.approx(evidence.level("throughput").median)


def test_step_time_check_reads_slower_steps_as_a_ratio_above_one():
    # GIVEN steps 15% longer  WHEN step_time:5% judges them
    outcome = judge("step_time:5%", side(1000 / 1.15, seed=1), side(1000, seed=2))
    # THEN it fails with a ratio near 1.15 and the step times in milliseconds
    assert outcome.status == FAIL
    assert outcome.figures["ratio"]["median"] == pytest.approx(1.15, abs=0.02)
    assert "mean step time rose 1" in outcome.message and "ms vs 16.0" in outcome.message


@pytest.mark.parametrize("candidate_mem, status", [
    ([400, 410, 405], FAIL),  # every round 30% above every reference round
    ([300, 420, 420], WARN),  # the median grew, but one round did not
    ([310, 305, 300], PASS),  # within 10%
])
def test_peak_memory_growth_must_show_in_every_round(candidate_mem, status):
    # GIVEN per-round peaks (MiB) against a reference of 300-310 MiB
    mib = 2**20
    candidate = side(1000, memory=[m * mib for m in candidate_mem], seed=1)
    reference = side(1000, memory=[300 * mib, 305 * mib, 310 * mib], seed=2)
    # WHEN peak_memory:10% judges them
    outcome = judge("peak_memory:10%", candidate, reference)
    # THEN only growth in every round fails
    assert outcome.status == status, outcome.message
    assert "MiB" in outcome.message


@pytest.mark.parametrize("text, status", [
    ("throughput:>=1300", FAIL),  # the whole CI is below the floor
    ("throughput:>=1002", WARN),  # the median is below, the CI reaches it
    ("throughput:>=900", PASS),
    ("step_time:<=12ms", FAIL),  # steps take 16 ms
    ("step_time:<=20ms", PASS),
    ("peak_memory:<=200MiB", FAIL),
    ("peak_memory:<=1GiB", PASS),
])
def test_absolute_limits_need_no_reference(text, status):
    # GIVEN one side at 1000 items/s (16 ms steps, 300 MiB), no reference
    candidate = side(1000, levels=[0.99, 1.0, 1.01], noise=0.01, seed=3)
    # WHEN an absolute check judges it
    outcome = judge(text, candidate)
    # THEN floors and ceilings fail only when the whole interval is past the limit
    assert outcome.status == status, outcome.message


def test_a_relative_check_without_reference_cannot_be_evaluated():
    outcome = judge("throughput:5%", side(1000))
    assert outcome.status == ERROR and "give --baseline or --against" in outcome.failure


def test_unmeasured_memory_is_an_error_not_a_pass():
    # GIVEN a reference whose probes recorded no peak memory
    outcome = judge("peak_memory:10%", side(1000), side(1000, memory=None))
    # THEN the check says it could not be evaluated
    assert outcome.status == ERROR and "not measured" in outcome.failure


def test_false_alarm_and_detection_rates_on_synthetic_jobs(monkeypatch):
    # GIVEN 100 simulated jobs whose machine level drifts by 2% (sd) between jobs and 1.5% between rounds
    monkeypatch.setattr(verdict, "BOOTSTRAP_RESAMPLES", 1000)  # enough for a 95% CI, and 4x quicker
    rng = np.random.default_rng(42)
    reference = side(1000, levels=list(1 + rng.normal(0, 0.015, 3)), seed=0)
    false_alarms = detected = 0
    for job in range(100):
        job_level = 1 + rng.normal(0, 0.02)
        levels = list(job_level * (1 + rng.normal(0, 0.015, 3)))
        same = side(1000, levels=levels, seed=job + 1)
        slow = side(1000 / 1.15, levels=levels, seed=job + 1)
        false_alarms += judge("throughput:5%", same, reference).status == FAIL
        detected += judge("throughput:5%", slow, reference).status == FAIL
    # THEN the gate stays quiet without a change and sees the 15% slowdown nearly always
    assert false_alarms <= 2, false_alarms
    assert detected >= 95, detected


@pytest.mark.parametrize("text", ["throughput:5%", "step_time:5%", "throughput:>=5", "step_time:<=1s"])
def test_a_side_without_step_samples_is_an_error_with_json_safe_figures(text):
    # GIVEN a candidate with no usable round  WHEN any timing check judges it
    outcome = judge(text, Sample([]), side(1000))
    # THEN it is reported as not evaluable (exit 2), not as a pass, and its figures hold null, not NaN
    assert outcome.status == ERROR and "no usable step samples" in outcome.failure
    json.dumps(outcome.to_dict(), allow_nan=False)


def test_interleaved_a_a_intervals_cover_no_change_when_rounds_differ_from_each_other():
    # GIVEN unchanged code measured in 3 lockstep rounds, each round with its own 4% offset between the sides
    # (which side's caches were warm, a frequency step): the gate's A/A runs on a shared VM looked like this
    rng = np.random.default_rng(11)
    covered, trials = 0, 200
    for seed in range(trials):
        offsets = list(np.exp(rng.normal(0, 0.04, 3)))
        candidate = side(1000, levels=offsets, noise=0.01, seed=2 * seed)
        reference = side(1000, noise=0.01, seed=2 * seed + 1)
        ratio = verdict.ratio_interval(candidate, reference, "throughput", INTERLEAVED, n_boot=400)
        covered += ratio.low <= 1 <= ratio.high
    # THEN about 95% of the intervals cover 1.00 (resampling the steps alone covered it far less often)
    assert covered / trials >= 0.9, covered
