"""Loss parity between a speed knob's probe and its float32 twin (analysis/parity.py)."""

import pytest

from tune_advisor import knobs
from tune_advisor.analysis import parity


def test_identical_losses_agree_and_a_flat_loss_against_a_falling_one_does_not():
    falling = [2.0 - 0.05 * i for i in range(20)]
    assert parity.compare(falling, falling).difference == 0
    found = parity.compare(falling, [2.0] * 20)
    assert not found.ok and found.steps == 20
    assert found.difference == pytest.approx(sum(0.05 * i for i in range(20)) / (2.0 * 20))  # the larger: 2.0


def test_a_reference_that_learns_to_zero_against_one_stuck_at_chance_differs_by_about_all_of_it():
    found = parity.compare([0.01, 0.001, 0.0, 0.0], [0.69, 0.70, 0.69, 0.69])
    assert 0.95 < found.difference <= 1.0 and not found.ok


def test_rounding_differences_are_within_tolerance():
    base = [1.5 - 0.01 * i for i in range(30)]
    assert parity.compare(base, [x * 1.004 for x in base]).ok


def test_only_common_finite_steps_count_and_too_few_say_nothing():
    assert parity.compare([1.0, None, 1.0, 1.0], [1.0, 5.0, 1.0, 1.0, 9.0]).steps == 3
    assert parity.compare([1.0, 1.0], [1.0, 2.0]) is None
    assert parity.compare([0.0] * 5, [0.0] * 5) is None  # no scale to compare against


def test_reference_settings_put_every_numeric_knob_back_to_float32():
    settings = knobs.full_settings({"amp": "bf16", "compile": "default", "batch_size": 64})
    reference = parity.reference_settings(settings)
    assert reference == knobs.full_settings({"batch_size": 64})
    assert parity.numeric_changes(settings) == {"amp": "bf16", "compile": "default"}
    assert parity.numeric_changes(reference) == {}
