"""Resuming an interrupted plan: finished probes are replayed, not run again, and the plan comes out the same."""

import json

import pytest

from tune_advisor import knobs, rundir
from tune_advisor.errors import UsageError
from tune_advisor.planner import PlanContext, Session, plan
from tune_advisor.probe.result import ProbeResult

from ..fakes import FakeBackend, FakeClock
from .planning import CNN, CPU_AMP_ONLY, cnn_rate


class Interrupted(FakeBackend):
    """Ctrl-C when asked for probe number `stop_after` + 1 (a pair asked for past that point is interrupted
    whole)."""

    def __init__(self, *args, stop_after=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop_after = stop_after

    def run(self, spec, role):
        if self.stop_after is not None and len(self.calls) >= self.stop_after:
            raise KeyboardInterrupt
        return super().run(spec, role)

    def pair(self, specs, roles, first):
        if self.stop_after is not None and len(self.calls) + 1 >= self.stop_after:
            raise KeyboardInterrupt
        return super().pair(specs, roles, first)


def run(budget_s=None, finished=None, stop_after=None, calls_before=(), lockstep=False):
    """One plan over the fake CNN. `stop_after`: Ctrl-C when the backend is asked for probe number stop_after + 1
    (`lockstep`: the backend measures pairs together, and a pair asked for past that point is interrupted whole).
    Returns (session, outcome or None, backend, [(saved probe dict, elapsed)])."""
    clock = FakeClock()
    backend = Interrupted(cnn_rate, moment=lambda s, role: 1.1 if s["channels_last"] else 1.0, clock=clock,
                          can_pair=lockstep, stop_after=stop_after)
    backend.calls = list(calls_before)  # the fake's jitter is seeded by its call count: continue the count
    saved = []

    def record(result):  # what analyze saves: the probe as results.json has it, and the clock then
        saved.append((json.loads(json.dumps(result.to_dict())), session.budget.elapsed()))

    session = Session(backend, budget_s, on_probe=record, clock=clock, finished=finished)
    ctx = PlanContext(baseline=knobs.full_settings({"batch_size": 16}), search={}, workload=CNN,
                      device=CPU_AMP_ONLY)
    try:
        outcome = plan(ctx, session, "adaptive")
    except KeyboardInterrupt:
        return session, None, backend, saved
    session.ledger.end_replay()  # as analyze does when the plan is over
    return session, outcome, backend, saved


def reloaded(saved):
    return [(ProbeResult.from_dict(entry), elapsed) for entry, elapsed in saved]


def trace(session):
    return [(p.id, p.role, knobs.describe(p.settings)) for p in session.ledger.probes]


@pytest.mark.parametrize("lockstep", [False, True], ids=["in-turn", "lockstep"])
@pytest.mark.parametrize("tight", [False, True])  # the budget ends the search (5 s fake probes)
def test_a_resumed_plan_runs_only_the_missing_probes_and_ends_as_an_uninterrupted_one(tight, lockstep):
    # a confirmation in turn keeps four rounds, one in lockstep two: a tight budget for each
    budget_s = (70.0 if lockstep else 90.0) if tight else None
    whole, expected, whole_backend, _ = run(budget_s, lockstep=lockstep)
    assert expected.speedup is not None and len(whole_backend.calls) > 6
    assert any("over budget" in u for u in whole.ledger.unexplored) == (budget_s is not None)
    # a duel (channels_last ran in a fast moment) is replayed
    assert any(p.role == "recheck" for p in whole.ledger.probes)
    for stop in range(1, len(whole_backend.calls)):
        # GIVEN a run interrupted while its backend was asked for probe `stop + 1` (in lockstep: the pair holding it)
        first, outcome, first_backend, saved = run(budget_s, stop_after=stop, lockstep=lockstep)
        done = len(first_backend.calls)
        assert outcome is None and (done == stop or (lockstep and done == stop - 1))
        # WHEN it is resumed from what it saved
        again, outcome, backend, _ = run(budget_s, finished=reloaded(saved), calls_before=first_backend.calls,
                                         lockstep=lockstep)
        # THEN only the probes that had not finished run, and the plan is the uninterrupted one, probe for probe
        assert backend.calls[done:] == whole_backend.calls[done:], stop
        assert trace(again) == trace(whole), stop
        assert [p.id for p in again.ledger.reused] == [p.id for p in first.ledger.probes] and not again.ledger.discarded
        assert outcome.recommended.settings == expected.recommended.settings
        assert outcome.speedup == expected.speedup
        # AND the budget counts the first run's time plus the resumed one's, as if uninterrupted
        assert again.budget.elapsed() == pytest.approx(whole.budget.elapsed())


def test_resuming_a_finished_run_runs_nothing():
    whole, expected, _, saved = run()
    again, outcome, backend, _ = run(finished=reloaded(saved))
    assert backend.calls == [] and trace(again) == trace(whole) and not again.ledger.replaying
    assert outcome.speedup == expected.speedup


def test_a_plan_that_takes_another_path_discards_the_rest_and_numbers_on():
    # GIVEN a run with no budget interrupted late, resumed with a budget that allows fewer probes
    _, _, first_backend, saved = run(stop_after=12)
    again, outcome, backend, _ = run(budget_s=45.0, finished=reloaded(saved), calls_before=first_backend.calls)
    # THEN the replay stops where the plan differs; the probes not asked for again are discarded
    reused, discarded = again.ledger.reused, again.ledger.discarded
    assert reused and discarded and len(reused) + len(discarded) == len(saved)
    differs = again.ledger.probes[len(again.ledger.reused)]
    was = saved[len(again.ledger.reused)][0]
    assert (differs.role, differs.settings) != (was["role"], was["settings"])
    # AND the plan goes on live (its confirmation runs), numbering on from the last probe kept
    assert len(backend.calls) > 12 and outcome.speedup is not None and not again.ledger.replaying
    ids = [p.id for p in again.ledger.probes]
    assert ids == [f"p{i:03d}" for i in range(1, len(ids) + 1)]


def space(**changes):
    base = {"device": "cpu", "baseline": {"batch_size": 16}, "search": {}, "strategy": "adaptive", "seed": 0}
    return {**base, **changes}


def test_resuming_names_what_changed_since_the_interrupted_run(tmp_path):
    workload = tmp_path / "w.py"
    workload.write_text("x = 1\n")
    before = rundir.identity(workload, space())
    previous = {"run": before, "environment": {"fingerprint": "abc"}, "probes": []}
    assert rundir.changes(previous, before, "abc") == []
    workload.write_text("x = 2\n")
    now = rundir.identity(workload, space(strategy="grid"))
    found = rundir.changes(previous, now, "def")
    assert found[0] == "the workload file changed"
    assert found[1] == 'strategy changed ("adaptive" then, "grid" now)'
    assert found[2] == "the hardware changed (fingerprint abc then, def now)"
    assert "older tune-advisor" in rundir.changes({"probes": []}, now, "abc")[0]


def test_a_damaged_probe_cannot_be_reused(tmp_path):
    previous = {"probes": [{"id": "p001", "settings": {}, "status": "ok", "step_time_s": "fast"}]}
    with pytest.raises(UsageError, match="probe p001 cannot be reused.*Run without --resume"):
        rundir.finished_probes(previous, tmp_path / "results.json")


def test_the_lock_refuses_a_second_holder_and_is_gone_after(tmp_path):
    with rundir.locked(tmp_path):
        with pytest.raises(UsageError, match=r"in use by another tune-advisor run \(pid \d+\)"):
            with rundir.locked(tmp_path):
                pass
    assert not (tmp_path / rundir.LOCK_NAME).exists()
    with rundir.locked(tmp_path):  # free again
        pass
