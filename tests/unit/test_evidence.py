"""What the probe child records of each measured step: results.json's `raw` series, epoch starts, input shapes."""

from __future__ import annotations

import torch

from tune_advisor.probe.evidence import RAW_SERIES, StepSeries, empty_raw


def batch(rows: int, width: int = 3):
    return (torch.zeros(rows, width), torch.zeros(rows))


def test_each_measured_step_keeps_its_times_items_and_loss_at_its_global_step():
    # GIVEN 3 warm-up steps, then measured steps 3 and 4, the second beginning an epoch with a short batch
    raw = empty_raw()
    series = StepSeries(raw, lambda b: float(b[0].shape[0]))
    series.add(3, 10.0, 10.25, 10.5, 11.0, batch(8), 2.5, new_epoch=False)
    series.add(4, 11.0, 11.5, 11.5, 12.0, batch(4), 2.4, new_epoch=True)
    # THEN the series hold one entry per measured step, the loss beside its global step (warm-up counted)
    assert list(raw) == list(RAW_SERIES)
    assert raw == {"step_s": [1.0, 1.0], "data_wait_s": [0.25, 0.5], "h2d_s": [0.25, 0.0], "items": [8.0, 4.0],
                   "loss": [2.5, 2.4], "loss_step": [3, 4]}
    # AND the step that began an epoch is known by its index; a short batch is not a new input shape
    assert series.shape_facts() == {"epoch_start_steps": [1], "distinct_input_shapes": 1, "input_shapes_static": True}
    series.add(5, 12.0, 12.0, 12.0, 12.5, batch(8, width=5), 2.3, new_epoch=False)
    assert series.shape_facts()["distinct_input_shapes"] == 2


def test_a_non_finite_loss_is_kept_as_null_at_its_step():
    raw = empty_raw()
    StepSeries(raw, lambda b: 1.0).non_finite_loss(7)
    assert raw["loss"] == [None] and raw["loss_step"] == [7] and raw["step_s"] == []
