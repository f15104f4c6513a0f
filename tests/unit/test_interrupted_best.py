"""An interrupted run's best so far (issue 63, part 8): saved in results.json as a candidate, not confirmed."""

import pytest

from tune_advisor import knobs, results
from tune_advisor.api import facade
from tune_advisor.planner import PlanContext, Session, plan

from ..conftest import golden
from ..fakes import FakeBackend, FakeClock
from .planning import CNN, CPU_AMP_ONLY, cnn_rate


class CutAt(FakeBackend):
    """Ctrl-C when the plan asks for a probe whose role `cut(role)` picks."""

    def __init__(self, *args, cut, **kwargs):
        super().__init__(*args, **kwargs)
        self.cut = cut

    def run(self, spec, role):
        if self.cut(role):
            raise KeyboardInterrupt
        return super().run(spec, role)

    def pair(self, specs, roles, first):
        if any(map(self.cut, roles)):
            raise KeyboardInterrupt
        return super().pair(specs, roles, first)


def interrupted_at(cut) -> Session:
    """The fake CNN's plan, Ctrl-C'd at its first probe whose role `cut(role)` picks; its session."""
    clock = FakeClock()
    session = Session(CutAt(cnn_rate, clock=clock, cut=cut), None, clock=clock)
    ctx = PlanContext(baseline=knobs.full_settings({"batch_size": 16}), search={}, workload=CNN, device=CPU_AMP_ONLY)
    with pytest.raises(KeyboardInterrupt):
        plan(ctx, session, "adaptive")
    return session


def test_a_run_interrupted_before_its_confirmation_saves_its_best_so_far_unconfirmed(tmp_path):
    # GIVEN a plan cut short as its confirmation began: it had kept changes that beat the baseline
    session = interrupted_at(lambda role: role.startswith("confirm"))
    best = facade._best_so_far(session.ledger)
    # THEN its best so far is that candidate: what it changes, its measured gain, and not confirmed
    assert best["probe"] == session.ledger.best.id and best["changes"] and best["confirmed"] is False
    low, high = best["gain"]["ci"]
    assert best["gain"]["median"] > 1 and low <= best["gain"]["median"] <= high
    # AND results.json holds it, as the typed record accepts and reads back
    document = golden()
    document["run"] = {"state": "running", "resumed": []}
    record = results.RunRecord(tmp_path / "results.json", document)
    record.interrupted(["interrupted"], best)
    record.save()
    saved = results.read(tmp_path / "results.json")
    assert saved["run"]["state"] == "interrupted" and saved["best_so_far"] == best


def test_a_run_interrupted_before_anything_beat_the_baseline_names_the_baseline_and_none_before_it():
    # GIVEN a plan cut at its first probe after the baseline: the baseline is its best so far, with nothing to change
    best = facade._best_so_far(interrupted_at(lambda role: role != "baseline").ledger)
    assert best["changes"] == {} and best["gain"] == {"median": 1.0, "ci": [1.0, 1.0]} and not best["confirmed"]
    # AND before the baseline measured there is none
    assert facade._best_so_far(interrupted_at(lambda role: True).ledger) is None
