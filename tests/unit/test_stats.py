import math

import numpy as np
import pytest

from tune_advisor.analysis import stats


def test_throughput_ci_brackets_the_true_rate_of_noisy_steps():
    # GIVEN 200 steps of 32 items at 10 ms ± 5% jitter (true rate 3200 items/s)
    rng = np.random.default_rng(1)
    times = 0.010 * (1 + rng.uniform(-0.05, 0.05, 200))
    median, low, high = stats.throughput_ci([32] * 200, times)
    assert low < 3200 < high
    assert high - low < 0.05 * median


def test_throughput_ci_is_tight_for_constant_steps():
    median, low, high = stats.throughput_ci([10] * 20, [0.5] * 20)
    assert median == pytest.approx(20) and low == pytest.approx(20) and high == pytest.approx(20)


def test_throughput_ci_of_nothing_is_nan():
    assert all(np.isnan(x) for x in stats.throughput_ci([], []))


def test_ratio_ci_sees_a_twofold_speedup_and_no_change():
    rng = np.random.default_rng(2)
    a = 0.02 * (1 + rng.uniform(-0.1, 0.1, 100))
    b = 0.01 * (1 + rng.uniform(-0.1, 0.1, 100))
    median, low, high = stats.ratio_ci([1] * 100, a, [1] * 100, b)
    assert 1.9 < low < median < high < 2.1
    _, low, high = stats.ratio_ci([1] * 100, a, [1] * 100, a[::-1])
    assert low < 1 < high


def test_a_window_too_short_for_its_loaders_waves_has_no_interval_from_its_steps():
    # GIVEN a 2-minute io_bound run's lockstep pair: 32 loader workers a side, so a wave of 32 batches (one step
    # waits half a second, the next ones find theirs ready), and only 9 turns (it read 2.47x [2.47, 2.47]: every
    # circular block resample of 9 steps was the 9 steps themselves)
    a_steps = [0.17, 0.035, 0.012, 0.002, 0.002, 0.55, 0.002, 0.002, 0.002]
    b_steps = [0.56, 0.001, 0.002, 0.001, 0.001, 0.001, 0.001, 0.001, 0.55]
    a_items, b_items = [32] * 9, [128] * 9
    median, low, high = stats.ratio_ci(a_items, a_steps, b_items, b_steps, waves=(32, 32), paired=True)
    # THEN the ratio is the two windows' and it has no interval of its own (the caller's comes from elsewhere)
    assert median == pytest.approx((128 * 9 / sum(b_steps)) / (32 * 9 / sum(a_steps)))
    assert math.isnan(low) and math.isnan(high)
    assert not stats.resamples(9, 32) and math.isnan(stats.throughput_ci(a_items, a_steps, wave=32)[1])
    # AND the same steps from a loader without workers resample, and their interval has a width
    median, low, high = stats.ratio_ci(a_items, a_steps, b_items, b_steps)
    assert low < median < high
    # AND one such measurement gets the interval of one round at the rounds' spread
    centre, low, high = stats.rounds_with_prior([1.41])
    half = stats.t95(stats.ROUND_SPREAD_DF) * stats.ROUND_SPREAD
    assert centre == pytest.approx(1.41) and (low, high) == pytest.approx((1.41 * math.exp(-half),
                                                                           1.41 * math.exp(half)))


def test_wave_noise_ignores_the_bimodal_pattern_of_loader_waves():
    # GIVEN 4 workers: each wave is one slow step (waiting for data) and three fast ones
    steps = [0.040, 0.001, 0.001, 0.001] * 10
    assert stats.relative_iqr(steps) > 1  # per-step noise looks enormous
    assert stats.wave_noise(steps, 4) == pytest.approx(0.0)  # but every wave takes the same time
    assert stats.wave_noise(steps[:12], 4) == float("inf")  # fewer than 4 waves: not enough to judge


def test_bootstrap_blocks_keep_loader_waves_whole():
    # GIVEN 8 loader workers: every 8th step waits 40 ms for the next wave of batches, the others take 1 ms
    times = [0.040 if i % 8 == 0 else 0.001 for i in range(64)]
    items = [32.0] * 64
    # WHEN the CI is computed with blocks of whole waves, and naively
    median, low, high = stats.throughput_ci(items, times, wave=8)
    _, naive_low, naive_high = stats.throughput_ci(items, times)
    # THEN the steady rate is pinned down, while mixing waves makes the interval several times wider
    assert median == pytest.approx(32 * 8 / 0.047, rel=0.02)
    assert (high - low) / median < 0.1
    assert (naive_high - naive_low) > 3 * (high - low)


def test_the_prediction_interval_of_runs_covers_one_more_run_about_95_percent_of_the_time():
    from tune_advisor.analysis.stats import prediction_interval

    # GIVEN runs whose throughput drifts 10% (log-normal) between runs, 3 or 5 runs at a time
    rng = np.random.default_rng(7)
    for n in (3, 5):
        covered = 0
        for _ in range(2000):
            runs = 1000 * np.exp(rng.normal(0, 0.1, n + 1))
            _, low, high = prediction_interval(runs[:n])
            covered += low <= runs[n] <= high
        # THEN the next run falls inside it about 95% of the time (a within-window CI would say nothing of it)
        assert 0.93 <= covered / 2000 <= 0.97, (n, covered)
    assert all(np.isnan(prediction_interval([1000.0])))


def test_a_ratio_over_rounds_covers_the_truth_when_rounds_drift_where_resampled_steps_do_not():
    from tune_advisor.analysis.stats import ratio_ci, rounds_ratio_interval

    # GIVEN A/A lockstep rounds (no true difference): within a round both sides share the machine's state, but
    # each round carries its own 4% offset between the sides (which side's caches were warm, a frequency step),
    # and the steps inside a round are tightly correlated
    rng = np.random.default_rng(3)
    covered_rounds = covered_steps = 0
    trials = 400
    for _ in range(trials):
        ratios, a_all, b_all = [], [], []
        for _ in range(3):
            offset = np.exp(rng.normal(0, 0.04))
            a = 0.02 * (1 + rng.normal(0, 0.01, 40))
            b = a * offset * (1 + rng.normal(0, 0.01, 40))
            ratios.append(a.sum() / b.sum())  # throughput of B over A
            a_all += list(a)
            b_all += list(b)
        _, low, high = ratio_ci([1.0] * 120, a_all, [1.0] * 120, b_all, paired=True)
        covered_steps += low <= 1 <= high
        _, low, high = rounds_ratio_interval(ratios, within=(low, high))
        covered_rounds += low <= 1 <= high
    # THEN Student's t over the rounds covers 1 about 95% of the time; the steps' bootstrap far less often
    assert covered_rounds / trials >= 0.92, covered_rounds
    assert covered_steps / trials < 0.6, covered_steps


def test_a_ratio_over_rounds_keeps_its_floor_and_its_centre():
    from tune_advisor.analysis.stats import rounds_ratio_interval

    # GIVEN rounds that agree to the third digit: the steps' CI is the floor
    centre, low, high = rounds_ratio_interval([1.200, 1.201, 1.199], within=(1.15, 1.25))
    assert centre == pytest.approx(1.2, abs=1e-3) and (low, high) == (1.15, 1.25)
    # GIVEN one round that went wrong: the centre shrugs it off, the interval widens honestly
    centre, low, high = rounds_ratio_interval([1.0, 1.0, 1.0, 1.3, 1.0])
    assert centre == pytest.approx(1.0) and low < 1.0 < high and high > 1.1
    # GIVEN one round: its steps' CI, or a pooled spread when other comparisons were repeated
    assert rounds_ratio_interval([1.1], within=(1.05, 1.15))[1:] == (1.05, 1.15)
    _, low, high = rounds_ratio_interval([1.1], within=(1.09, 1.11), spread=(0.05, 4))
    assert low < 1.0 and high > 1.2  # t(4 df) x 5%: wider than the steps say
    assert all(np.isnan(rounds_ratio_interval([1.1])[1:]))


def test_a_ratio_over_rounds_does_not_jump_between_two_clusters_of_rounds():
    from tune_advisor.analysis.stats import hodges_lehmann, rounds_ratio_interval

    # GIVEN rounds whose recommended side settled in one of two states per process (ratios near 1.30 or 1.55),
    # split 8/8 in one run and 10/6 in the next
    even = [1.30, 1.31, 1.29, 1.30, 1.32, 1.28, 1.30, 1.31] + [1.55, 1.56, 1.54, 1.55, 1.57, 1.53, 1.55, 1.56]
    uneven = even[:8] + [1.29, 1.31] + even[8:14]
    centre_even, low_even, high_even = rounds_ratio_interval(even)
    centre_uneven, _, _ = rounds_ratio_interval(uneven)
    # THEN the centre moves with the mix by a fraction of the gap, where a median would land on a cluster's edge
    assert float(np.median(uneven)) < 1.32
    assert abs(np.log(centre_uneven / centre_even)) < 0.25 * np.log(1.55 / 1.30)
    assert 1.35 < centre_uneven < centre_even < 1.50 and low_even < centre_even < high_even
    # AND the centre is the Hodges-Lehmann estimate of the log ratios: two values give their mean, one stray of
    # five is shrugged off
    assert hodges_lehmann([0.0, 1.0]) == 0.5 and hodges_lehmann([0.0, 0.0, 0.0, 0.0, 5.0]) == 0.0
    assert np.isnan(hodges_lehmann([]))


def test_a_drift_pooled_over_settings_has_all_their_degrees_of_freedom():
    from tune_advisor.analysis.stats import pooled_log_sd, prediction_interval

    # GIVEN three settings with 2, 3 and 1 runs: 1 + 2 degrees of freedom (the single run adds none)
    sd, df = pooled_log_sd([[1000, 1100], [500, 520, 480], [800]])
    assert df == 3 and 0.02 < sd < 0.08
    assert pooled_log_sd([[1000], [2000]]) == (pytest.approx(float("nan"), nan_ok=True), 0)
    # AND a single run with that spread gets a prediction interval around itself
    centre, low, high = prediction_interval([800], spread=(sd, df))
    assert centre == pytest.approx(800) and low < 800 < high


def test_a_prediction_interval_adds_a_level_known_from_elsewhere_in_quadrature():
    from tune_advisor.analysis.stats import prediction_interval, t95

    # GIVEN four runs whose spread is pooled elsewhere (log sd 0.05 over 20 degrees of freedom)
    rates = [1000.0, 1040.0, 980.0, 1010.0]
    centre, low, high = prediction_interval(rates, (0.05, 20))
    assert math.log(high / centre) == pytest.approx(t95(20) * 0.05 * math.sqrt(1 + 1 / 4))
    # WHEN a level moves between these runs and the next by a log sd of 0.04 they cannot show
    c2, low2, high2 = prediction_interval(rates, (0.05, 20), between=0.04)
    # THEN the centre stays and the half-width is the two in quadrature, the known one at the normal's 1.96
    assert c2 == pytest.approx(centre)
    assert math.log(high2 / c2) == pytest.approx(math.hypot(t95(20) * 0.05 * math.sqrt(1.25), 1.959964 * 0.04))
    assert math.log(c2 / low2) == pytest.approx(math.log(high2 / c2))


def test_a_level_calibrated_for_coverage_holds_it_on_new_heavy_tailed_shifts_where_one_by_moments_does_not():
    from tune_advisor.analysis.stats import Z95, between_for_coverage
    rng = np.random.default_rng(3)

    def sessions(n):
        # most sessions move a little, one in eight jumps by 25%: heavy tails
        shift = np.where(rng.random(n) < 0.125, rng.choice([-0.25, 0.25], n), rng.normal(0, 0.02, n))
        return shift + rng.normal(0, 0.03, n), np.full(n, 1.96 * 0.03)  # deviations, within-run half-widths

    def covered(deviations, halves, between):
        return float(np.mean(np.abs(deviations) <= np.hypot(halves, Z95 * between)))

    dev, half = sessions(4000)
    conformal = between_for_coverage(dev, half, 0.95)
    moments = np.sqrt(max(0.0, np.mean(dev ** 2) - np.mean((half / 1.96) ** 2)))
    new_dev, new_half = sessions(4000)
    assert covered(new_dev, new_half, conformal) == pytest.approx(0.95, abs=0.015)
    assert covered(new_dev, new_half, moments) < 0.92  # the normal level undercovers these tails
    # already inside without any level: none needed; too few values for the coverage asked: no finite level
    assert between_for_coverage([0.01, -0.02, 0.0], [0.05, 0.05, 0.05], 0.5) == 0.0
    assert between_for_coverage([0.01, 0.02], [0.05, 0.05], 0.95) == float("inf")
    assert np.isnan(between_for_coverage([], [], 0.95))


def test_signed_rank_critical_values_are_the_tabled_ones():
    from tune_advisor.analysis.stats import signed_rank_critical

    # GIVEN the two-sided 5% critical values of Wilcoxon's signed-rank statistic as tabled (reject when W <= w)
    tabled = {6: 0, 7: 2, 8: 3, 9: 5, 10: 8, 11: 10, 12: 13, 15: 25, 20: 52, 25: 89, 30: 137}
    # THEN the exact count over ranks gives them, and none below 6 values (2/2^5 already exceeds 5%)
    assert {n: signed_rank_critical(n) for n in tabled} == tabled
    assert [signed_rank_critical(n) for n in range(1, 6)] == [-1] * 5
    # AND at 1% (tabled: n = 8, 9, 10 -> 0, 1, 3; nothing below 8)
    assert [signed_rank_critical(n, 0.99) for n in range(7, 11)] == [-1, 0, 1, 3]
    # AND the count agrees with enumerating all 2^9 sign patterns
    sums = [sum(r for r, bit in zip(range(1, 10), f"{p:09b}") if bit == "1") for p in range(2 ** 9)]
    w = signed_rank_critical(9)
    assert sum(s <= w for s in sums) / 2 ** 9 <= 0.025 < sum(s <= w + 1 for s in sums) / 2 ** 9


def test_the_walsh_interval_runs_between_walsh_averages_and_needs_six_values():
    from tune_advisor.analysis.stats import walsh_interval

    # GIVEN six values: the critical value is 0, so the interval runs from the smallest Walsh average to the
    # largest, the values' own extremes
    assert walsh_interval([3.0, 1.0, 2.0, 6.0, 4.0, 5.0]) == (1.0, 6.0)
    # GIVEN seven (critical value 2): the third Walsh average from either end
    assert walsh_interval(list(range(7))) == (1.0, 5.0)
    # GIVEN five or fewer: no interval reaches 95%
    assert all(np.isnan(walsh_interval([1.0, 2.0, 3.0, 4.0, 5.0])))
    assert all(np.isnan(walsh_interval([])))


def test_a_ratio_over_eight_rounds_covers_the_truth_about_95_percent_of_the_time():
    from tune_advisor.analysis.stats import rounds_ratio_interval

    # GIVEN 2,000 draws of 8 rounds whose ratios are log-normal around a true 1.3x (log sd 5%)
    rng = np.random.default_rng(11)
    covered = 0
    for _ in range(2000):
        _, low, high = rounds_ratio_interval(1.3 * np.exp(rng.normal(0, 0.05, 8)))
        covered += low <= 1.3 <= high
    # THEN the interval from the clipped rounds' Walsh averages holds it about as often as it says
    assert 0.93 <= covered / 2000 <= 0.98, covered


def test_two_disturbed_rounds_of_ten_widen_the_ratio_interval_at_most_threefold():
    from tune_advisor.analysis.stats import rounds_ratio_interval, t95

    # GIVEN 200 draws of 10 rounds (log sd 3% around 1.2x), then the same with 2 rounds read under a busy
    # neighbour: 3x off, above or below
    factor = 3.0  # the stated bound (rounds_ratio_interval's docstring): widths within 3x in 95% of draws
    rng = np.random.default_rng(5)
    ratios, t_ratios = [], []
    for draw in range(200):
        logs = np.log(1.2) + rng.normal(0, 0.03, 10)
        disturbed = logs.copy()
        disturbed[rng.choice(10, 2, replace=False)] += np.log(3.0) * (1 if draw % 2 else -1)
        centre, low, high = rounds_ratio_interval(np.exp(logs))
        centre_d, low_d, high_d = rounds_ratio_interval(np.exp(disturbed))
        ratios.append(np.log(high_d / low_d) / np.log(high / low))
        # the centre moves a few %, where the geometric mean would move a fifth of log(3): 22%
        assert abs(np.log(centre_d / centre)) < 0.1
        t_half = [t95(9) * x.std(ddof=1) / np.sqrt(10) for x in (logs, disturbed)]
        t_ratios.append(t_half[1] / t_half[0])
    # THEN the interval stays within the factor of the undisturbed one, where Student's t (the interval before)
    # widens many times
    assert np.percentile(ratios, 95) <= factor and np.median(ratios) <= 2.5, np.percentile(ratios, [50, 95])
    assert np.median(t_ratios) > 10


def test_stray_rounds_are_clipped_to_three_robust_sds_and_none_without_a_spread():
    from tune_advisor.analysis.stats import clip_strays

    # GIVEN rounds with a median of 0.5, a median deviation of 1.5 (robust sd 2.22) and one 40 away
    values = [0.0, 1.0, -1.0, 2.0, -2.0, 40.0]
    clipped = clip_strays(values)
    # THEN only the stray moves, to 3 robust sds from the median
    assert list(clipped[:5]) == values[:5] and clipped[5] == pytest.approx(0.5 + 3 * 1.4826 * 1.5)
    # GIVEN over half the rounds equal: no scale to judge by, nothing clipped
    assert list(clip_strays([1.0, 1.0, 1.0, 1.0, 5.0, 9.0])) == [1.0, 1.0, 1.0, 1.0, 5.0, 9.0]


def test_a_confirmation_of_ten_rounds_two_disturbed_states_its_centre_and_how_its_interval_was_made():
    from tune_advisor import knobs
    from tune_advisor.planner import Session
    from tune_advisor.planner.confirm import _speedup
    from tune_advisor.planner.ratios import pair_ratio
    from tune_advisor.probe.result import ProbeResult, Status

    from ..fakes import FakeBackend, FakeClock

    # GIVEN ten confirmation rounds in turn reading 2.0x (log sd 3% between rounds, steady steps within each), then
    # the same with two of them read under a busy neighbour that slowed the baseline 3x
    base_settings = knobs.full_settings({"batch_size": 16})
    winner_settings = {**base_settings, "num_workers": 2}
    ratios = 2.0 * np.exp(np.random.default_rng(2).normal(0, 0.03, 10))
    disturbed = ratios.copy()
    disturbed[[3, 8]] *= 3

    def rounds(ratios):
        return [tuple(ProbeResult(id=f"{side}{i}", settings=s, status=Status.OK, role="confirm",
                                  raw={"step_s": [step] * 20, "items": [16.0] * 20})
                      for side, s, step in (("a", base_settings, 0.02), ("b", winner_settings, 0.02 / ratio)))
                for i, ratio in enumerate(ratios)]

    def speedup(rounds):
        session = Session(FakeBackend(lambda s: 1000.0), clock=FakeClock())
        return _speedup(session, rounds, rounds[0][0], rounds[0][1], timed=False, notes=[])

    calm, busy = speedup(rounds(ratios)), speedup(rounds(disturbed))
    # THEN the speedup the report states keeps its centre, and says how its interval was made
    assert busy["median"] == pytest.approx(calm["median"], rel=0.1)
    assert "signed-rank" in busy["interval"] and "Student" not in busy["interval"]
    # AND the two disturbed rounds are the strays (6 rounds: too few to tell)
    strays = stats.stray_rounds(disturbed)
    assert list(np.flatnonzero(strays)) == [3, 8] and not stats.stray_rounds(disturbed[:6]).any()
    # AND the stated interval stays within the stated 3x of the calm one's width: its floor comes from the steps of
    # the other rounds (pooled over every round's steps, the floor swelled as Student's t does)
    assert np.log(busy["ci_high"] / busy["ci_low"]) <= 3 * np.log(calm["ci_high"] / calm["ci_low"])
    everything = stats.rounds_ratio_interval(disturbed, within=pair_ratio(rounds(disturbed))[1:])
    assert np.log(everything[2] / everything[1]) > 3 * np.log(calm["ci_high"] / calm["ci_low"])
