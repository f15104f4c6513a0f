"""The figures a report prints for the baseline and the recommendation agree with its confirmed speedup."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tune_advisor import knobs
from tune_advisor.consistency import contradictions
from tune_advisor.planner import figures
from tune_advisor.probe.result import ProbeResult, Status

ROOT = Path(__file__).resolve().parents[2]
BASE = knobs.full_settings({"batch_size": 16})
REC = {**BASE, "optimizer_impl": "fused"}


def run(pid: str, settings: dict, rate: float, partner: str | None = None, steps: int = 20) -> ProbeResult:
    """A finished probe whose window reads `rate` samples/s (steps of 16 samples, a little jitter)."""
    step = 16 / rate
    step_s = [step * (1 + 0.01 * ((i % 3) - 1)) for i in range(steps)]
    extra = {"lockstep": {"partner": partner}} if partner else {}
    return ProbeResult(id=pid, settings=dict(settings), status=Status.OK, role="recheck", extra=extra,
                       raw={"step_s": step_s, "items": [16.0] * steps})


def lstm_like() -> list[ProbeResult]:
    """The shape of one lstm_collate run: its baseline alone at a fast moment and a slow one, its recommendation
    alone only in slow moments, and lockstep rounds that read the recommendation 1.08x the baseline."""
    return [run("p001", BASE, 706.0), run("p031", REC, 611.0),
            run("p034", BASE, 546.0, "p035"), run("p035", REC, 581.0, "p034"),
            run("p036", BASE, 688.0, "p037"), run("p037", REC, 753.0, "p036"),
            run("p040", REC, 596.0), run("p041", BASE, 592.0)]


SPEEDUP = {"median": 1.0775, "ci_low": 1.0584, "ci_high": 1.0997}


def test_the_two_figures_stand_in_the_ratio_of_the_confirmed_speedup():
    probes = lstm_like()
    # GIVEN each setting's runs alone on their own: the faster settings read slower than the baseline
    separate = {side: figures.figure(probes, s) for side, s in (("baseline", BASE), ("recommended", REC))}
    assert separate["recommended"]["median"] < separate["baseline"]["median"]
    # WHEN the figures are worked out together with the confirmed speedup
    got = figures.figures(probes, BASE, REC, SPEEDUP)
    base, rec = got["baseline"], got["recommended"]
    # THEN the recommendation reads the baseline's level times the speedup, and the level pools both settings'
    # runs alone, the recommendation's divided by the speedup
    assert rec["median"] / base["median"] == pytest.approx(SPEEDUP["median"], rel=1e-9)
    level = math.exp(sum(math.log(r) for r in (706.0, 592.0, 611.0 / 1.0775, 596.0 / 1.0775)) / 4)
    assert base["median"] == pytest.approx(level, rel=0.005)
    assert base["runs"] == rec["runs"] == ["p001", "p041", "p031", "p040"]
    assert "2 runs of the baseline and 2 runs of the recommendation divided by the confirmed speedup (alone)" \
        in base["interval"]
    assert rec["interval"].startswith("the baseline's level times the confirmed speedup (1.08x)")
    # AND the recommendation's interval also carries the speedup's own uncertainty
    assert base["ci_low"] < base["median"] < base["ci_high"]
    assert rec["ci_high"] / rec["ci_low"] > base["ci_high"] / base["ci_low"]


def test_without_a_confirmed_speedup_each_setting_has_its_own_figure():
    probes = lstm_like()
    for speedup in (None, {"median": None}, {"median": float("nan")}):
        got = figures.figures(probes, BASE, REC, speedup)
        assert got == {"baseline": figures.figure(probes, BASE), "recommended": figures.figure(probes, REC)}
    # AND a recommendation that keeps the baseline shows the baseline's own figure twice
    same = figures.figures(probes, BASE, BASE, SPEEDUP)
    assert same["baseline"] == same["recommended"] == figures.figure(probes, BASE)


def test_settings_measured_only_beside_partners_share_a_level_of_that_kind():
    probes = [p for p in lstm_like() if p.paired_with]
    got = figures.figures(probes, BASE, REC, SPEEDUP)
    assert "(beside a partner)" in got["baseline"]["interval"]
    assert got["recommended"]["median"] / got["baseline"]["median"] == pytest.approx(SPEEDUP["median"])


def test_a_saved_run_gives_the_same_figures_again_from_its_own_probes():
    probes = lstm_like()
    document = {"baseline": probes[0].to_dict(), "recommended": probes[1].to_dict(), "speedup": SPEEDUP,
                "probes": [p.to_dict() for p in probes]}
    assert json.loads(json.dumps(figures.of_document(document))) == figures.figures(probes, BASE, REC, SPEEDUP)


def test_the_consistency_check_flags_figures_that_disagree_with_the_speedup():
    probes = lstm_like()
    document = {"baseline": probes[0].to_dict(), "recommended": probes[1].to_dict(), "speedup": SPEEDUP,
                "probes": [p.to_dict() for p in probes], "findings": []}
    # GIVEN the figures each setting's own runs give: 646 -> 604 sequences/s beside a 1.08x speedup
    separate = {"baseline": figures.figure(probes, BASE), "recommended": figures.figure(probes, REC)}
    found = contradictions({**document, "figures": separate})
    assert len(found) == 1 and "the figures read 0.93x" in found[0] and "the speedup reads 1.08x" in found[0]
    # AND the figures on one level agree with it
    assert contradictions({**document, "figures": figures.of_document(document)}) == []


def cnn_like(rec_rates: list[float]) -> list[ProbeResult]:
    """Confirmation rounds in lockstep (the baseline steady near 390 samples/s, the recommendation at
    `rec_rates`), then each alone once."""
    probes = []
    for i, rate in enumerate(rec_rates):
        a, b = f"p{2 * i + 1:03d}", f"p{2 * i + 2:03d}"
        probes += [run(a, BASE, 390.0 * (1 + 0.01 * (i % 3 - 1)), b), run(b, REC, rate, a)]
    return probes + [run("p100", REC, 850.0), run("p101", BASE, 395.0)]


def test_a_setting_whose_own_runs_spread_wider_than_the_pool_gets_its_own_spread():
    # GIVEN a recommendation that settles in one of two states per process, seen over ten lockstep rounds (cnn's:
    # about 740 or 870 samples/s), beside a baseline within ±1%
    two_states = [870.0, 860.0, 740.0, 875.0, 735.0, 865.0, 880.0, 745.0, 870.0, 860.0]
    speedup = {"median": 2.1, "ci_low": 2.0, "ci_high": 2.2}
    got = figures.figures(cnn_like(two_states), BASE, REC, speedup)
    base, rec = got["baseline"], got["recommended"]
    # THEN the recommendation's interval rests on its own runs' spread and says so; the baseline keeps the pool
    assert "the drift between this setting's own runs, wider than the other settings' (9 degrees of freedom)" \
        in rec["interval"]
    assert "from every repeated setting" in base["interval"]
    assert rec["ci_low"] < 740.0 < 880.0 < rec["ci_high"]
    # AND with as few of its own runs as a short confirmation leaves (five rounds), the pool decides, as with
    # steady runs
    few = figures.figures(cnn_like(two_states[:5]), BASE, REC, speedup)["recommended"]
    steady = figures.figures(cnn_like([860.0] * 10), BASE, REC, speedup)["recommended"]
    assert "from every repeated setting" in few["interval"] and "from every repeated setting" in steady["interval"]
    assert steady["ci_high"] / steady["ci_low"] < rec["ci_high"] / rec["ci_low"]


def test_a_figure_carries_the_drift_between_sessions_that_its_runs_cannot_show():
    probes = lstm_like()
    # GIVEN the figures as the runs alone would give them, with no drift between sessions (as
    # benchmarks/session_drift.py works them out to calibrate it), and labelled so
    within = figures.figures(probes, BASE, REC, SPEEDUP, between=0.0)
    assert all(within[side]["interval"].endswith("no drift between sessions (--session-drift 0)")
               or "no drift between sessions (--session-drift 0), widened" in within[side]["interval"]
               for side in ("baseline", "recommended"))
    # WHEN they carry the drift measured between an analysis and a later run
    got = figures.figures(probes, BASE, REC, SPEEDUP)
    for side in ("baseline", "recommended"):
        # THEN the centres stay and each half-width (in logs) grows by 1.96 sd in quadrature, no more
        assert got[side]["median"] == pytest.approx(within[side]["median"])
        half, inner = (math.log(f[side]["ci_high"] / f[side]["median"]) for f in (got, within))
        assert half == pytest.approx(math.hypot(inner, 1.959964 * figures.SESSION_DRIFT), rel=1e-6)
        # AND the label says so
        assert f"a drift between sessions of {figures.SESSION_DRIFT:.1%} (log sd" in got[side]["interval"]
    # AND a figure of one setting alone carries it too
    one = figures.figure(probes, REC)
    assert "a drift between sessions" in one["interval"]
    alone = figures.figure(probes, REC, between=0.0)
    assert one["ci_high"] / one["ci_low"] > alone["ci_high"] / alone["ci_low"]


def test_a_drift_between_sessions_set_for_a_quiet_machine_narrows_the_figures_and_says_where_it_came_from():
    probes = lstm_like()
    default = figures.figures(probes, BASE, REC, SPEEDUP)
    quiet = figures.figures(probes, BASE, REC, SPEEDUP, between=0.02)
    for side in ("baseline", "recommended"):
        assert quiet[side]["median"] == pytest.approx(default[side]["median"])
        assert quiet[side]["ci_high"] / quiet[side]["ci_low"] < default[side]["ci_high"] / default[side]["ci_low"]
        assert "a drift between sessions of 2.0% (log sd, set by --session-drift)" in quiet[side]["interval"]
        assert "measured on shared cloud machines" in default[side]["interval"]


def test_a_confirmed_speedup_says_where_a_later_measure_of_it_falls():
    median, low, high = SPEEDUP["median"], SPEEDUP["ci_low"], SPEEDUP["ci_high"]
    # WHEN a confirmed speedup is given the range a later session's measure of it falls in
    got = figures.later(median, low, high)
    # THEN each side of its CI (in logs) grows by 1.96 sd of the speedup's drift in quadrature, no more
    assert got["ci_low"] == pytest.approx(median * math.exp(-math.hypot(math.log(median / low),
                                                                        1.959964 * figures.SPEEDUP_DRIFT)), rel=1e-6)
    assert got["ci_high"] == pytest.approx(median * math.exp(math.hypot(math.log(high / median),
                                                                        1.959964 * figures.SPEEDUP_DRIFT)), rel=1e-6)
    assert got["ci_low"] < low < median < high < got["ci_high"] and got["drift"] == figures.SPEEDUP_DRIFT
    assert f"of {figures.SPEEDUP_DRIFT:.1%} (log sd, measured on shared cloud machines)" in got["interval"]
    # AND it follows --session-drift: a quiet machine's narrower, and 0 leaves the CI itself
    quiet = figures.later(median, low, high, between=figures.SESSION_DRIFT / 2)
    assert quiet["drift"] == pytest.approx(figures.SPEEDUP_DRIFT / 2) and low > quiet["ci_low"] > got["ci_low"]
    assert "scaled from --session-drift" in quiet["interval"]
    none = figures.later(median, low, high, between=0.0)
    assert (none["ci_low"], none["ci_high"]) == pytest.approx((low, high))
    # AND a speedup without a CI has no such range
    assert figures.later(median, float("nan"), float("nan")) is None and figures.later(median, None, high) is None


def test_the_speedups_drift_is_what_the_committed_benchmark_rows_calibrate(monkeypatch):
    # The constant is the calibration of benchmarks/speedup_drift.py over its committed rows, worked out again
    # here: a changed csv or calibration cannot leave it stale.
    import csv

    from tune_advisor.analysis import stats

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import speedup_drift

    with speedup_drift.CSV.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 136
    assert stats.between_for_coverage(*speedup_drift.deviations(rows), 0.95) == pytest.approx(
        figures.SPEEDUP_DRIFT, abs=0.0005)
