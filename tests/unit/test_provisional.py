"""The provisional recommendation (issue 63, part 3): the plan's best so far, with its measured gain, saved in
results.json (`best_so_far`) and shown on the live status line while the run goes on, well before its end."""

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from tune_advisor import knobs, record, results
from tune_advisor.api import AnalyzeOptions, facade
from tune_advisor.cli import analyze
from tune_advisor.planner import PlanContext, plan
from tune_advisor.probe.result import Status

from ..fakes import FakeBackend, FakeClock
from .planning import CNN, CPU_AMP_ONLY

BUDGET_S = 60.0
BEFORE_PLAN_S = 6.0  # inspecting the workload (its first steps) and measuring the machine's peaks


class SlowSteps(FakeBackend):
    """A workload whose step takes about a second: each probe's wall also holds its child's start (1 s) and its
    three warm-up steps, as a real child's does."""

    def _measure(self, spec, role, slowdown):
        result = super()._measure(spec, role, slowdown)
        if result.ok:
            result.wall_s += 1.0 + 3 * result.step_s[0]
        return result


class CutAt(SlowSteps):
    """Ctrl-C when the plan asks for a probe whose role starts with `cut`."""

    def __init__(self, *args, cut: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.cut = cut

    def pair(self, specs, roles, first):
        if any(role.startswith(self.cut) for role in roles):
            raise KeyboardInterrupt
        return super().pair(specs, roles, first)


class SavedRecord(results.RunRecord):
    """A RunRecord that keeps, at each save, the fake clock's time and results.json as read back from disk."""

    def __init__(self, path, document, clock):
        super().__init__(path, document)
        self.clock, self.saves = clock, []

    def save(self):
        super().save()
        self.saves.append((self.clock.now, results.read(self.path)))


def amp_wins(s):
    """About one step a second at batch 16; bf16 1.5x faster, nothing else pays."""
    return 16.0 * (1.5 if s["amp"] == "bf16" else 1.0) * (0.7 if s["checkpointing"] else 1.0)


def nothing_wins(s):
    return 16.0 * (0.8 if s["amp"] == "bf16" else 1.0) * (0.7 if s["checkpointing"] else 1.0)


@pytest.fixture
def live(monkeypatch):
    """analyze's live output, its status line's every text kept with the fake time it was shown at."""
    monkeypatch.setattr(analyze, "err", Console(file=io.StringIO(), width=300))
    output = analyze.LiveOutput(Path("slow.py"), BUDGET_S, show=True, quiet=False)
    output.shown = []
    return output


def start(tmp_path, live, rate, backend_class=SlowSteps, **backend):
    """A 1-minute analysis of a slow-step workload on a fake clock, as analyze sets it up after inspecting the
    workload: its record, the session, the live output started."""
    clock = FakeClock()
    document = results.new_document(["tune-advisor", "analyze", "slow.py", "--budget", "1m"], {}, {"path": "slow.py"})
    document["run"] = {"state": "running", "resumed": []}
    document["budget"]["limit_s"] = BUDGET_S
    saved = SavedRecord(tmp_path / "results.json", document, clock)
    update = live.status.update
    live.status.update = lambda text: (live.shown.append((clock.now, text)), update(text))
    info = SimpleNamespace(path=Path("slow.py"), script=None, baseline=knobs.full_settings({"batch_size": 16}),
                           facts=SimpleNamespace(model_class="Slow", parameters=1), preload=[])
    specs = facade.ProbeSpecs(info, "cpu", None, AnalyzeOptions(budget=BUDGET_S), live)
    clock.now = BEFORE_PLAN_S
    session = facade._session(saved, backend_class(rate, clock=clock, steps=40, **backend), specs, BUDGET_S, 0.0,
                              [], live, clock=clock)
    live.on_start(info, session)
    ctx = PlanContext(baseline=info.baseline, search={}, workload=CNN, device=CPU_AMP_ONLY)
    return saved, session, ctx


def first_provisional(saves):
    """The first save whose best so far changes something: (fake time, that document)."""
    return next((now, doc) for now, doc in saves if (doc.get("best_so_far") or {}).get("changes"))


def test_a_slow_step_workloads_first_provisional_recommendation_is_saved_and_shown_within_a_minute(tmp_path, live):
    # GIVEN a 1-minute run of a workload whose step takes a second, where bf16 is 1.5x faster
    saved, session, ctx = start(tmp_path, live, amp_wins)
    outcome = plan(ctx, session, "adaptive")
    assert outcome.recommended.settings["amp"] == "bf16"
    # THEN results.json held a provisional recommendation within the minute: what it changes, its measured gain
    # with a CI, not confirmed, when it was found and from which probe
    now, doc = first_provisional(saved.saves)
    best = doc["best_so_far"]
    assert now <= BUDGET_S and doc["run"]["state"] == "running"
    assert best["changes"] == {"amp": "bf16"} and best["confirmed"] is False
    low, high = best["gain"]["ci"]
    assert 1 < low <= best["gain"]["median"] <= high
    assert BEFORE_PLAN_S < best["elapsed_s"] <= now + 1e-3 and best["probe"]  # elapsed_s: rounded to the ms in {p["id"] for p in doc["probes"]}
    assert doc["budget"]["first_provisional_s"] == best["elapsed_s"]
    # AND it was saved when the plan kept it, not a probe later
    assert best["elapsed_s"] == pytest.approx(now, abs=1e-3)
    # AND later probes refine its gain, never the time it was found
    later = [d["best_so_far"] for _, d in saved.saves if (d.get("best_so_far") or {}).get("probe") == best["probe"]]
    assert len(later) > 1 and {b["elapsed_s"] for b in later} == {best["elapsed_s"]}
    # AND the live status line showed it as provisional, with the same gain, within the minute
    shown_at, line = next((t, text) for t, text in live.shown if "provisional:" in text)
    median, (low, high) = best["gain"]["median"], best["gain"]["ci"]
    assert shown_at <= BUDGET_S and f"provisional: amp=bf16 · {median:.2f}x [{low:.2f}, {high:.2f}]" in line


def test_the_complete_document_drops_the_provisional_block_and_keeps_when_it_came(tmp_path, live):
    # GIVEN the slow-step run, planned to its end
    saved, session, ctx = start(tmp_path, live, amp_wins)
    outcome = plan(ctx, session, "adaptive")
    found_s = saved.document["budget"]["first_provisional_s"]
    # WHEN it completes
    facade._complete(saved, outcome, session, AnalyzeOptions(budget=BUDGET_S), resuming=False)
    doc = results.read(saved.path)
    # THEN its recommendation is the answer: no best so far, and the time to the first provisional one stays
    assert doc["run"]["state"] == "complete" and "best_so_far" not in doc
    assert doc["recommended"]["settings"]["amp"] == "bf16" and doc["budget"]["first_provisional_s"] == found_s
    assert doc["budget"]["phases"]["rules_s"] >= 0


def test_while_nothing_beats_the_baseline_it_is_the_best_so_far_and_nothing_is_shown(tmp_path, live):
    # GIVEN a run where no setting beats the baseline
    saved, session, ctx = start(tmp_path, live, nothing_wins)
    plan(ctx, session, "adaptive")
    # THEN every save after the baseline's own names the baseline, changing nothing, at gain 1 (the plan starts
    # from the baseline once its probe is recorded)
    first = saved.saves[0][1]
    assert "best_so_far" not in first and [p["role"] for p in first["probes"]] == ["baseline"]
    after = [doc["best_so_far"] for _, doc in saved.saves[1:]]
    base_id = session.ledger.baseline.id
    assert after and all(b["probe"] == base_id and b["changes"] == {} for b in after)
    assert after[0]["gain"] == {"median": 1.0, "ci": [1.0, 1.0]}
    # AND no first provisional time, nor a provisional status line
    assert saved.document["budget"].get("first_provisional_s") is None
    assert not any("provisional:" in text for _, text in live.shown)


def test_a_failed_baseline_leaves_no_best_so_far(tmp_path, live):
    saved, session, ctx = start(tmp_path, live, lambda s: Status.CRASHED)
    plan(ctx, session, "adaptive")
    assert all("best_so_far" not in doc for _, doc in saved.saves)
    assert analyze.best_so_far(session) == ""


def test_a_run_interrupted_after_its_provisional_recommendation_keeps_it_with_when_it_was_found(tmp_path, live):
    # GIVEN the slow-step run stopped by Ctrl-C as its confirmation began
    saved, session, ctx = start(tmp_path, live, amp_wins, backend_class=CutAt, cut="confirm")
    with pytest.raises(KeyboardInterrupt):
        plan(ctx, session, "adaptive")
    provisional = dict(saved.document["best_so_far"])
    # WHEN analyze saves what finished
    facade._interrupted(saved, session, resuming=False)
    doc = results.read(saved.path)
    # THEN the interrupted document keeps that best so far, unconfirmed, with the time it was found
    assert doc["run"]["state"] == "interrupted"
    assert doc["best_so_far"] == provisional and provisional["changes"] == {"amp": "bf16"}
    assert doc["budget"]["first_provisional_s"] == provisional["elapsed_s"]


@pytest.mark.parametrize("junk, where", [
    ({"confirmed": True}, "best_so_far.confirmed"),
    ({"gain": {"median": 1.2, "ci": [1.1, 1.3, 1.4]}}, "best_so_far.gain.ci"),
    ({"elapsed_s": "soon"}, "best_so_far.elapsed_s"),
])
def test_the_typed_record_refuses_a_best_so_far_that_is_not_one(tmp_path, junk, where):
    document = results.new_document(["tune-advisor"], {}, {"path": "m.py"})
    document["best_so_far"] = {"probe": "p002", "changes": {"amp": "bf16"}, "gain": {"median": 1.2, "ci": [1.1, 1.3]},
                               "confirmed": False, "elapsed_s": 12.5}
    record.parse(document)  # the shape analyze writes
    document["best_so_far"].update(junk)
    with pytest.raises(record.ValidationError, match=where.replace(".", r"\.")):
        record.parse(document)


def test_the_runs_phases_are_saved_typed_in_its_budget(tmp_path):
    document = results.new_document(["tune-advisor"], {}, {"path": "m.py"})
    saved = results.RunRecord(tmp_path / "results.json", document)
    saved.phase("inspection_s", 2.34567)
    saved.phase("calibration_s", 0.0)
    saved.save()
    phases = results.read_record(saved.path).budget.phases
    assert phases.inspection_s == 2.346 and phases.calibration_s == 0.0 and phases.reports_s is None


def test_only_the_first_probes_of_settings_count_flops(tmp_path, live):
    from tune_advisor.planner.keep import DUEL_ROLE
    from tune_advisor.probe.backend import ProbeLimits

    # GIVEN the probe specs of an analysis
    _, session, _ = start(tmp_path, live, amp_wins)

    def counts(role):
        return session.make_spec("p099", knobs.full_settings({"batch_size": 16}), role, ProbeLimits()).count_flops

    # THEN the baseline and screening probes count one step's FLOPs; a duel's recheck, an ablation side and the
    # confirmation's rounds and runs alone, which measure settings measured before, do not
    assert all(counts(r) for r in ("baseline", "knob:amp", "ladder:batch_size", "bisect:batch_size"))
    assert not any(counts(r) for r in (DUEL_ROLE, "ablate:with", "ablate:amp", "confirm:baseline",
                                       "confirm:recommended", "confirm:alone:baseline"))
