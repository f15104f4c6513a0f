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
