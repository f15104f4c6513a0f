"""The bound on a loader's wait for a batch (issue 63, part 6): from the baseline's own step time."""

import statistics

import pytest

from tune_advisor import knobs
from tune_advisor.planner import Session, budget

from ..fakes import FakeBackend, FakeClock


def test_the_loader_bound_is_twenty_baseline_steps_scaled_to_the_batch_and_workers_at_least_ten_seconds(monkeypatch):
    clock = FakeClock()
    session = Session(FakeBackend(lambda s: 100.0, clock=clock), None, clock=clock)  # 100 samples/s
    settings = knobs.full_settings({"batch_size": 50, "num_workers": 0})
    # GIVEN no baseline yet: no bound but the probe's own limit
    assert session.budget.loader_wait_s(settings) is None
    # WHEN the baseline has measured (0.5 s steps)
    session.ledger.start_from(session.run(settings, "baseline"))
    step = statistics.median(session.ledger.baseline.step_s)
    monkeypatch.setattr(budget.os, "sched_getaffinity", lambda pid: {0, 1})  # two cores
    wait = session.budget.loader_wait_s
    # THEN 20 of its steps, at least 10 s; times the batch over the baseline's; times the workers over the cores
    assert wait(settings) == pytest.approx(max(10.0, 20 * step))
    assert wait({**settings, "batch_size": 200}) == pytest.approx(20 * step * 4)
    assert wait({**settings, "batch_size": 200, "num_workers": 8}) == pytest.approx(20 * step * 4 * 4)
    assert wait({**settings, "batch_size": 10}) == pytest.approx(max(10.0, 20 * step))  # never below the baseline's
