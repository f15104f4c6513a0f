"""How long a probe child measures: until a cap or the protocol is met, then a loader-fed window is rounded up to
whole loader waves, or to whole epochs when the next is near."""

from __future__ import annotations

from tune_advisor.probe.spec import Protocol
from tune_advisor.probe import window
from tune_advisor.probe.window import EPOCH_ROUNDING_CAP, MIN_WAVES_AT_CAP, EpochWindow, StopRule, step_cap

STEADY = [0.1] * 40  # steps that vary by nothing: the protocol's noise is met
NOISY = [0.1, 0.3] * 20  # an IQR/median far above the bar


def test_a_window_short_of_an_epoch_boundary_goes_on_to_it():
    # GIVEN 64-step epochs, caps of 200 steps and 3 s, and the protocol met after 32 steps in 0.5 s
    window = EpochWindow(64, 200, 3.0)
    assert not window.done(False, 31, 0.48)
    # THEN the next 32 steps (a projected 1.0 s in all) are measured too, even if the protocol wavers meanwhile
    assert not window.done(True, 32, 0.5) and not window.done(False, 63, 1.0)
    # AND at 64 steps, a whole epoch, it stops
    assert window.done(True, 64, 1.02)


def test_a_far_epoch_boundary_does_not_extend_the_window():
    # GIVEN a long epoch: going on to its end would pass the step cap, or the time cap, by more than the factor
    assert EpochWindow(5000, 200, 3.0).done(True, 30, 1.0)
    slow = 2.0 * EPOCH_ROUNDING_CAP * 30 / 64  # seconds for 30 steps such that 64 are projected at twice the cap
    assert EpochWindow(64, 200, 1.0).done(True, 30, slow)
    assert not EpochWindow(64, 200, 2.0).done(True, 30, slow)  # within the factor of a 2 s cap


def test_steps_slower_than_projected_stop_at_the_time_limit():
    window = EpochWindow(64, 200, 2.0)
    assert not window.done(True, 32, 1.0)  # 64 steps projected at 2 s
    assert window.done(True, 40, 2.0 * EPOCH_ROUNDING_CAP)  # but the steps slowed down


def test_without_a_known_epoch_the_protocol_alone_decides():
    window = EpochWindow(None, 200, 3.0)  # no loader workers, or an IterableDataset without len
    assert not window.done(False, 33, 0.5) and window.done(True, 34, 0.6)


def test_short_of_an_epoch_the_window_still_ends_on_whole_loader_waves():
    # GIVEN 2 loader workers (a wave of 2 steps holds one wait for data), no known epoch, the protocol met at 13
    window = EpochWindow(None, 200, 3.0, wave=2)
    # THEN it measures one more step, to 14: 7 whole waves, so as many waits as batches' worth of waves
    assert not window.done(True, 13, 1.0) and window.done(True, 14, 1.08)
    # AND an epoch boundary, when near, decides over the waves (a whole epoch holds whole waves of its own)
    assert not EpochWindow(64, 200, 3.0, wave=3).done(True, 32, 0.5)
    # AND whole waves past the factor of the step cap are not measured
    assert EpochWindow(None, 4, 3.0, wave=8).done(True, 5, 0.2)


def test_the_step_cap_counts_loader_waves():
    assert step_cap(200, 0) == step_cap(200, 1) == 200
    assert step_cap(200, 16) == MIN_WAVES_AT_CAP * 16  # a busy loader gets as many waves as one process gets steps


def test_the_protocol_is_met_by_enough_steady_steps_and_time():
    rule = StopRule(Protocol(min_steps=10, min_time_s=1.0), workers=0, epoch_steps=None)
    assert not rule.done(STEADY[:9], 1.5)  # too few steps
    assert not rule.done(STEADY[:12], 0.5)  # too short
    assert not rule.done(NOISY[:12], 1.5)  # too noisy
    assert StopRule(Protocol(min_steps=10, min_time_s=1.0), workers=0, epoch_steps=None).done(STEADY[:12], 1.5)


def test_the_noise_is_judged_again_only_as_the_window_grows(monkeypatch):
    # GIVEN a window whose noise never meets the bar, counted each time it is judged
    judged = []

    def noise(step_s, wave):
        judged.append(len(step_s))
        return float("inf")

    monkeypatch.setattr(window, "wave_noise", noise)
    rule = StopRule(Protocol(min_steps=20, min_time_s=1.0, max_steps=10_000), workers=0, epoch_steps=None)
    steps = [0.002] * 5000
    for n in range(1, len(steps) + 1):
        assert not rule.done(steps[:n], 1.0 + n * 0.002)
    # THEN it was judged from the protocol's minimum on, each time the window had grown by NOISE_RECHECK, not at
    # every step (each judgement costs time in proportion to the steps, inside the loop being measured)
    assert judged[0] == 20 and len(judged) < 120  # of 4,981 steps
    assert all(b >= a * window.NOISE_RECHECK for a, b in zip(judged, judged[1:]))


def test_a_noisy_measurement_stops_at_a_cap():
    rule = StopRule(Protocol(max_steps=30, max_time_s=15.0), workers=0, epoch_steps=None)
    assert not rule.done(NOISY[:29], 3.0) and rule.done(NOISY[:30], 3.0)
    assert StopRule(Protocol(max_time_s=2.0), workers=0, epoch_steps=None).done(NOISY[:12], 2.0)


def test_a_met_protocol_goes_on_to_the_next_epoch_boundary_when_near():
    # GIVEN 2 loader workers and 16-step epochs: the protocol is met after 12 steady steps
    rule = StopRule(Protocol(min_steps=10, min_time_s=1.0), workers=2, epoch_steps=16)
    # THEN measuring goes on to the end of the epoch, even if the noise wavers meanwhile
    assert not rule.done(STEADY[:12], 1.2) and not rule.done(NOISY[:15], 1.5) and rule.done(NOISY[:16], 1.6)
