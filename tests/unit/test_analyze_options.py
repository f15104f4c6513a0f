"""AnalyzeOptions: every option of analyze, checked and normalised once, before anything runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tune_advisor.api import AnalyzeOptions
from tune_advisor.errors import UsageError
from tune_advisor.probe.spec import Protocol


def test_durations_sizes_paths_and_lists_are_normalised():
    options = AnalyzeOptions(out="report", budget="1m30s", probe_timeout="10s", max_memory="2GiB",
                             only_knobs=["amp", "batch_size"], select=["TA1"], command=["tune-advisor"],
                             protocol=None)
    assert options.out == Path("report") and options.budget == 90.0 and options.probe_timeout == 10.0
    assert options.max_memory == 2 * 2**30 and options.protocol == Protocol()
    assert options.only_knobs == ("amp", "batch_size") and options.select == ("TA1",)
    assert options.command == ("tune-advisor",) and options.ignore is None
    assert AnalyzeOptions(budget=None).budget is None and AnalyzeOptions().budget == 3 * 60
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.budget = 1.0


@pytest.mark.parametrize("options, message", [
    ({"strategy": "random"}, "--strategy random: expected one of adaptive, grid"),
    ({"only_knobs": ["warp_speed"]}, "--knobs warp_speed: no such knob"),
    ({"executor": "dask"}, "--executor dask: expected one of local, ray"),
    ({"ray_address": "auto"}, "--ray-address needs --executor ray"),
    ({"budget": "soon"}, "'soon' is not a duration"),
    ({"max_memory": "lots"}, "'lots' is not a memory size"),
    ({"session_drift": -0.05}, "--session-drift -0.05: expected how far this machine's level moves"),
    ({"session_drift": 7.4}, "--session-drift 7.4: expected .* log sd, from 0"),
    ({"train_steps": 0}, "--train-steps 0: expected how many training steps"),
    ({"train_steps": 2.5}, "--train-steps 2.5: expected .* a whole number of at least 1"),
])
def test_a_bad_option_is_a_usage_error_when_the_options_are_made(options, message):
    with pytest.raises(UsageError, match=message):
        AnalyzeOptions(**options)
