"""`analyze` end to end with real child probes on tiny workloads and on the bad fixtures."""

import dataclasses
import json
import re

import pytest

from tune_advisor import api, knobs, results
from tune_advisor.api import facade
from tune_advisor.consistency import contradictions
from tune_advisor.probe.result import Status

from ..conftest import BAD, FAST, FIXTURES, WORKLOADS

pytestmark = pytest.mark.usefixtures("short_confirmation")

PROBE_KEYS = {"id", "settings", "status", "error", "throughput", "step_time_s", "data_wait_frac",
              "peak_memory_bytes", "loss", "gpu", "wall_s"}


def analyze(path, tmp_path, protocol=FAST, **options):
    return api.analyze(path, api.AnalyzeOptions(out=tmp_path / "out", device="cpu", protocol=protocol, **options))


def test_cli_analyze_recommends_loader_workers_for_slow_storage(cli, tmp_path):
    # WHEN analyze runs on a workload whose samples each wait 3 ms for storage (loader workers, AMP, and knobs that
    # cannot apply on a CPU; not compile, whose duels against eager on this tiny model took up to 140 s of rechecks,
    # nor the batch ladder and the workers' own knobs, 40 s more of this test: the planner's unit tests and the
    # framework and script analyses run those)
    out = tmp_path / "out"
    result = cli("analyze", WORKLOADS / "tiny_io.py", "-o", out, "--device", "cpu", "--min-time", "0.3",
                 "--min-steps", "5", "--warmup", "1", "--budget", "5m", "--json", "--knobs",
                 "num_workers,pin_memory,amp,cudnn_benchmark")
    assert result.exit_code == 0, result.output
    # THEN stdout is the results document, also saved to the output folder
    printed = json.loads(result.stdout)
    saved = results.read(out / "results.json")
    assert printed == saved
    assert {"schema_version", "tool", "created", "command", "environment", "workload", "baseline", "recommended",
            "speedup", "probes", "findings", "budget"} <= set(saved)
    assert saved["environment"]["device"] == "cpu" and saved["environment"]["fingerprint"]
    for probe in saved["probes"]:
        assert PROBE_KEYS <= set(probe) and set(probe["settings"]) == set(knobs.KNOBS)  # every knob
    # AND loader workers are recommended, with a confirmed speedup whose CI excludes 1
    assert saved["recommended"]["settings"]["num_workers"] in (2, 4)
    assert saved["speedup"]["ci_low"] > 1.3
    # AND the report agrees with itself: its two throughputs stand in the ratio of that speedup
    figures = saved["figures"]
    assert figures["recommended"]["median"] / figures["baseline"]["median"] == pytest.approx(
        saved["speedup"]["median"])
    assert contradictions(saved) == []
    assert len({p["id"] for p in saved["probes"]}) == len(saved["probes"])
    assert saved["budget"]["probes_run"] == len(saved["probes"])
    # AND knobs that cannot apply on a CPU are listed with the reason, not silently dropped
    skipped = {p["error"] for p in saved["probes"] if p["status"] == "skipped"}
    assert any("no CUDA device" in reason for reason in skipped)
    # AND FLOPs are counted by the probes that first measure settings, not again in a duel's re-measurements, the
    # ablation's or the confirmation's
    counted = {p["role"]: not p["extra"]["collectors"]["flops"].startswith("skipped")
               for p in saved["probes"] if p["status"] == "ok"}
    assert counted["baseline"] and {role for role, yes in counted.items() if not yes} >= {"confirm:baseline"}
    assert all(yes == facade.counts_flops(role) for role, yes in counted.items())


def test_failing_batch_sizes_are_recorded_and_never_recommended(tmp_path):
    for name, status in (("cpu_oom.py", Status.OOM), ("segfault.py", Status.CRASHED)):
        # the grid runs every SEARCH batch size; the adaptive planner may rightly stop at a plateau below 128
        result = analyze(BAD / name, tmp_path / name, budget="4m", strategy="grid")
        failed = [p for p in result.probes if p.status is status]
        assert failed and all(p.settings["batch_size"] >= 128 for p in failed), name
        assert result.recommended.ok and result.recommended.settings["batch_size"] < 128
        saved = results.read(result.results_path)
        assert status.value in {p["status"] for p in saved["probes"]}


def test_hanging_loader_workers_time_out_and_the_analysis_goes_on(tmp_path, monkeypatch):
    # GIVEN loader workers that block forever, a bound on a batch's wait (here 2 baseline steps, at least 2 s; 20 and
    # 10 s by default) and no probe timeout: only the bound, from the baseline's batch time, ends those probes soon
    from tune_advisor.planner import budget

    monkeypatch.setattr(budget, "LOADER_WAIT_FACTOR", 2.0)
    monkeypatch.setattr(budget, "LOADER_WAIT_MIN_S", 2.0)
    result = analyze(BAD / "worker_hang.py", tmp_path, budget="4m",
                     only_knobs=("num_workers", "batch_size"))  # the loader's, and one to go on with
    # THEN each probe with workers ends as a timeout within its bound (plus its start), saying where it was
    hung = [p for p in result.probes if p.status is Status.TIMEOUT]
    assert hung and all(p.settings["num_workers"] > 0 for p in hung)
    for p in hung:
        bound = re.search(r"delivered no batch within ([\d.]+) s", p.error)
        assert bound and "last phase: warm-up" in p.error, p.error
        assert p.wall_s < float(bound[1]) + 10, (p.id, p.wall_s, p.error)
    # AND the analysis goes on to its end
    assert result.recommended.ok and result.recommended.settings["num_workers"] == 0


def test_a_stated_run_too_short_to_repay_a_compile_is_recorded_and_compile_goes_untried(cli, tmp_path):
    # GIVEN a tiny MLP whose steps take milliseconds, and a run of 50 steps: even the most compile could gain saves
    # far less than a compile takes
    result = cli("analyze", WORKLOADS / "tiny_mlp.py", "-o", tmp_path / "out", "--device", "cpu", "--knobs",
                 "compile", "--train-steps", "50", "--min-time", "0.1", "--min-steps", "3", "--warmup", "1",
                 "--no-profile", "--quiet")
    assert result.exit_code == 0, result.output
    document = results.read(tmp_path / "out" / "results.json")
    # THEN results.json records the run's length, and compile was skipped untried with the reason
    assert document["workload"]["train_steps"] == 50
    assert not any(p["settings"].get("compile", "off") != "off" and p["status"] == "ok" for p in document["probes"])
    assert any(d.startswith("compile: skipped: the 50 steps of the run --train-steps states would save at most")
               for d in document["plan"]["decisions"])


def test_a_diverging_baseline_ends_with_a_clear_note(tmp_path):
    result = analyze(BAD / "nan_loss.py", tmp_path)
    assert result.baseline.status is Status.DIVERGED and "loss became" in result.baseline.error
    assert result.speedup is None and "baseline probe failed (diverged)" in result.notes[0]


def test_a_dataset_error_is_reported_with_the_users_message(tmp_path):
    protocol = dataclasses.replace(FAST, min_steps=12, max_steps=12)  # reads the whole 256-item epoch
    result = analyze(BAD / "dataset_raises.py", tmp_path, protocol=protocol)
    assert result.baseline.status is Status.ERROR
    assert "corrupt record at index 137" in result.baseline.error


def test_cli_probe_prints_a_table_or_json(cli, tmp_path):
    fast = ["--min-time", "0.1", "--min-steps", "3", "--warmup", "1", "--device", "cpu"]
    result = cli("probe", WORKLOADS / "tiny_mlp.py", "--set", "batch_size=32", *fast, "--json")
    assert result.exit_code == 0, result.output
    probe = json.loads(result.stdout)
    assert PROBE_KEYS <= set(probe) and probe["status"] == "ok" and probe["settings"]["batch_size"] == 32
    result = cli("probe", WORKLOADS / "tiny_mlp.py", *fast)
    assert result.exit_code == 0
    for label in ("status", "throughput", "step time", "data wait", "peak memory", "samples/s"):
        assert label in result.stdout


def test_cli_grid_strategy_runs_every_search_combination(cli, tmp_path):
    # GIVEN a workload whose SEARCH has 8 combinations, 4 of them with pin_memory (CUDA only)
    out = tmp_path / "out"
    result = cli("analyze", WORKLOADS / "tiny_search.py", "-o", out, "--device", "cpu", "--strategy", "grid",
                 "--min-time", "0.1", "--min-steps", "3", "--warmup", "1", "--quiet")
    assert result.exit_code == 0, result.output
    saved = results.read(out / "results.json")
    # THEN the 4 that apply ran once each (the baseline is one of them), the others were skipped with the reason
    ran = {(p["settings"]["batch_size"], p["settings"]["num_workers"]) for p in saved["probes"]
           if p["role"] in ("baseline", "grid")}
    assert ran == {(16, 0), (16, 1), (32, 0), (32, 1)}
    skipped = [p for p in saved["probes"] if p["status"] == "skipped"]
    assert len(skipped) == 4 and all("no CUDA device" in p["error"] for p in skipped)
    assert saved["plan"]["strategy"] == "grid" and saved["plan"]["decisions"]


def test_cli_rejects_an_unknown_strategy(cli, tmp_path):
    result = cli("analyze", WORKLOADS / "tiny_mlp.py", "-o", tmp_path, "--strategy", "random")
    assert result.exit_code == 2 and "--strategy random: expected one of adaptive, grid" in result.output


def test_cli_rejects_an_unknown_knob_before_any_probe(cli, tmp_path):
    result = cli("analyze", WORKLOADS / "tiny_mlp.py", "-o", tmp_path / "out", "--knobs", "batch_size,warp_speed")
    assert result.exit_code == 2 and "--knobs warp_speed: no such knob; the knobs are batch_size" in result.output
    assert not (tmp_path / "out" / "results.json").exists()


def test_budget_bounds_the_wall_time_and_lists_what_was_left(cli, tmp_path):
    # GIVEN a loader-bound workload with more to explore than 20 s allow (probes with many loader workers take
    # longer: warm-up and step cap are counted in waves; 16 workers took 6 s, 32 took 16 s)
    out = tmp_path / "out"
    result = cli("analyze", FIXTURES / "io_bound.py", "-o", out, "--device", "cpu", "--budget", "20s",
                 "--min-time", "0.3", "--min-steps", "5", "--warmup", "1", "--quiet")
    assert result.exit_code == 0, result.output
    budget = results.read(out / "results.json")["budget"]
    # THEN the whole analysis stays within 10% of the budget and says what it did not get to
    assert budget["used_s"] <= 20 * 1.1
    assert any("over budget" in u or "stopped when the budget ran out" in u for u in budget["unexplored"])
