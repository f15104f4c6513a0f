"""How long a probe child measures: a loader-fed window is rounded up to whole epochs when the next is near."""

from __future__ import annotations

from tune_advisor.probe.child import EPOCH_ROUNDING_CAP, whole_epochs_pay


def test_a_window_short_of_an_epoch_boundary_goes_on_to_it():
    # GIVEN 32 steps measured in 0.5 s of a 64-step epoch, caps of 200 steps and 3 s
    # THEN the next 32 steps (a projected 1.0 s in all) are worth measuring
    assert whole_epochs_pay(32, 0.5, 64, 200, 3.0)
    # and at 64 steps, a whole epoch, it may stop
    assert not whole_epochs_pay(64, 1.0, 64, 200, 3.0)


def test_a_far_epoch_boundary_does_not_extend_the_window():
    # GIVEN a long epoch: going on to its end would pass twice the step cap, or twice the time cap
    assert not whole_epochs_pay(30, 1.0, 5000, 200, 3.0)
    assert not whole_epochs_pay(30, 2.0, 64, 200, 2.0)  # 64 steps projected at 4.27 s > 2 x 2 s
    assert whole_epochs_pay(30, 2.0, 64, 200, 4.3 / EPOCH_ROUNDING_CAP)  # within twice a 2.15 s cap


def test_without_a_known_epoch_nothing_changes():
    assert not whole_epochs_pay(33, 0.5, None, 200, 3.0)  # no loader workers, or an IterableDataset without len
