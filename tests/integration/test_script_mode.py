"""Script mode with real probe children: a plain argparse script analysed end to end, and every way a script can
be unmeasurable ending in exit code 2 with what was seen and what to do, with no process left behind."""

from __future__ import annotations

import json

import psutil
import pytest

from tune_advisor import knobs
from tune_advisor.api.inspection import inspect_workload
from tune_advisor.probe import lockstep, runner
from tune_advisor.probe.result import Status
from tune_advisor.probe.spec import ProbeSpec

from ..conftest import BAD, FAST, WORKLOADS

TINY = WORKLOADS / "scripts" / "tiny_script.py"
FAST_ARGS = ["--min-time", "0.1", "--min-steps", "3", "--warmup", "1", "--no-profile"]


def leftovers() -> list[psutil.Process]:
    """This test process's descendants other than the zygotes (which stay to serve the next probe)."""
    zygotes = {z.proc.pid for z in runner._zygotes.values()}
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in zygotes and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("name, args, expected", [
    ("exits_early.py", [], ["exits_early.py", "exited with sys.exit(2) before its first optimizer step",
                            "the following arguments are required: --data", "fix: pass the arguments it needs"]),
    ("crashes_early.py", [], ["crashes_early.py:14", "raised RuntimeError", "before its first optimizer step",
                              "fix: run `python ", "crashes_early.py` on its own"]),
    ("no_optimizer_step.py", [], ["without calling optimizer.step()", "built 1 DataLoader(s)", "nothing trained",
                                  "-- --epochs 1"]),
    ("reads_stdin.py", [], ["reads_stdin.py:5", "read from stdin before its first optimizer step",
                            "end-of-file", "fix: pass its input as an argument or a file"]),
    ("spawns_processes.py", [], ["starts processes of its own", "Process.start at spawns_processes.py:23",
                                 "fix: script mode measures training in one process"]),
])
def test_an_unmeasurable_script_exits_2_saying_what_was_seen(cli, tmp_path, name, args, expected):
    # WHEN the user analyses a script that cannot reach a measured optimizer step
    result = cli("analyze", BAD / "scripts" / name, "-o", tmp_path / "out", "--budget", "60s",
                 "--probe-timeout", "30s", *FAST_ARGS, "--", *args)
    # THEN it exits 2 with one message naming what the script did and what to do, no traceback, nothing left running
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    for fragment in expected:
        assert fragment in text, text
    assert "Traceback" not in result.output
    assert leftovers() == []


def test_a_script_slower_than_the_probe_limit_to_its_first_step_is_stopped(cli, tmp_path):
    result = cli("analyze", BAD / "scripts" / "slow_start.py", "-o", tmp_path / "out", "--probe-timeout", "3s",
                 *FAST_ARGS)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "was still running before its first optimizer step after 3 s, the probe limit" in text
    assert "raise --probe-timeout" in text
    assert leftovers() == []


def probe_spec(tmp_path, args, **settings) -> ProbeSpec:
    info = inspect_workload(TINY, "cpu", tmp_path, 60, script={"args": args, "map": {}, "cwd": None})
    return ProbeSpec(id="p", workload=str(info.path), settings=knobs.full_settings({**info.baseline, **settings}),
                     protocol=FAST, timeout_s=60, script=info.script)


def test_a_probe_of_a_script_measures_its_steps_in_a_scratch_folder(tmp_path, monkeypatch):
    # GIVEN a script that writes a log and a checkpoint where it runs, run from the user's folder
    monkeypatch.chdir(tmp_path)
    spec = probe_spec(tmp_path / "work", [], batch_size=16)
    result = runner.run_probe(spec, tmp_path / "work")
    # THEN its optimizer steps are measured with the knob's batch size, and its files went to a scratch folder
    assert result.status is Status.OK, result.error
    assert set(result.items) == {16.0} and len(result.step_s) >= FAST.min_steps
    assert result.to_dict()["loss"]["finite"] is True
    assert result.applied["loader"]["batch_size"] == 16
    assert not (tmp_path / "tiny_log.txt").exists() and not (tmp_path / "tiny_checkpoint.pt").exists()
    assert "script-cwd-" in result.extra["script"]["cwd"]
    # AND the training thread's CPU share of its fetches is recorded (it loads in-process), as a plain probe's
    assert 0.0 <= result.extra["fetch_cpu_frac"] <= 1.0
    assert leftovers() == []


def test_a_probe_runs_the_script_in_the_folder_the_user_names(tmp_path):
    spec = probe_spec(tmp_path / "work", [])
    here = tmp_path / "here"
    here.mkdir()
    spec = ProbeSpec(**{**spec.__dict__, "script": {**spec.script, "cwd": str(here)}})
    result = runner.run_probe(spec, tmp_path / "work")
    assert result.status is Status.OK, result.error
    assert (here / "tiny_log.txt").exists() and result.extra["script"]["cwd"] == str(here)


def test_a_script_that_ends_before_enough_steps_is_an_error_saying_so(tmp_path):
    # 256 samples in batches of 128, one epoch: two optimizer steps, one of them warm-up
    spec = probe_spec(tmp_path, ["--epochs", "1", "--batch-size", "128"])
    result = runner.run_probe(spec, tmp_path)
    assert result.status is Status.ERROR
    assert "ended after 2 optimizer steps, 1 of them measured" in result.error and "train longer" in result.error


def test_analyze_a_script_with_a_mapped_flag(cli, tmp_path, monkeypatch, short_confirmation):
    # GIVEN the tiny script, its batch size set through its own --batch-size flag
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = cli("analyze", TINY, "-o", out, "--budget", "40s", "--knobs", "batch_size", "--probe-timeout", "30s",
                 "--map", "batch_size=--batch-size", *FAST_ARGS, "--", "--epochs", "20")
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    # THEN results.json says it was a script, with its arguments and map
    assert doc["workload"]["kind"] == "script"
    assert doc["workload"]["script"]["args"] == ["--epochs", "20"]
    assert doc["workload"]["script"]["map"] == {"batch_size": {"flag": "--batch-size", "values": {}}}
    # AND a probe at another batch size reached the script through its flag
    other = [p for p in doc["probes"] if p["status"] == "ok" and p["settings"]["batch_size"] != 8]
    assert other, [p["settings"]["batch_size"] for p in doc["probes"]]
    argv = other[0]["extra"]["script"]["argv"]
    assert argv[:2] == ["--epochs", "20"] and argv[2:] == ["--batch-size", str(other[0]["settings"]["batch_size"])]
    assert not (tmp_path / "tiny_log.txt").exists()
    assert leftovers() == []


def test_two_script_probes_take_turns_in_lockstep(tmp_path):
    # GIVEN two configurations of the tiny script, measured as the planner's duels and confirmation are
    reference = probe_spec(tmp_path, [])
    candidate = ProbeSpec(**{**reference.__dict__, "id": "c", "settings": {**reference.settings, "batch_size": 16}})
    reference = ProbeSpec(**{**reference.__dict__, "id": "r"})
    results = lockstep.run_pair([reference, candidate], tmp_path, ["recheck", "knob:batch_size"], first=1)
    # THEN both measured the same number of steps, strictly one after the other, each step the script's own
    assert [r.status for r in results] == [Status.OK, Status.OK], [r.error for r in results]
    n = len(results[0].step_s)
    assert n == len(results[1].step_s) >= FAST.min_steps
    spans = sorted((a, b, r.id) for r in results for a, b in r.extra["lockstep"]["spans"])
    assert all(end <= start for (_, end, _), (start, _, _) in zip(spans, spans[1:])), "steps overlapped"
    assert "".join(name for _, _, name in spans) == "".join(("cr", "rc")[i % 2] for i in range(n))
    assert set(results[1].items) == {16.0} and set(results[0].items) == {8.0}
    assert leftovers() == []


def test_a_pair_whose_script_runs_out_of_epochs_is_a_whole_shorter_comparison(tmp_path):
    # GIVEN a pair whose candidate script ends by itself (3 epochs of 2 steps) before the protocol is met: the
    # reference (50 epochs) is stopped with it
    reference = probe_spec(tmp_path, [])
    short = {**reference.script, "args": ["--epochs", "3"]}
    candidate = ProbeSpec(**{**reference.__dict__, "id": "c", "script": short,
                             "settings": {**reference.settings, "batch_size": 128}})
    reference = ProbeSpec(**{**reference.__dict__, "id": "r"})
    results = lockstep.run_pair([reference, candidate], tmp_path, ["recheck", "knob:batch_size"], first=0)
    # THEN both sides keep their measured steps as a result: the confirmation and duels can use the pair (a
    # confirmation of train_cnn at batch 256 was thrown away for this, 37 steps in)
    assert [r.status for r in results] == [Status.OK, Status.OK], [r.error for r in results]
    assert len(results[1].step_s) >= FAST.min_steps and len(results[0].step_s) >= len(results[1].step_s)
    assert results[0].extra["lockstep"]["stopped"] == "c ended"
    assert leftovers() == []


SCRIPTS = WORKLOADS / "scripts"
# the analyses measure the baseline at least (on an idle machine the whole batch ladder); the probes at another
# batch size are run directly below, so that a loaded machine's budget cannot leave them out
ANALYZE_FAST = ["--budget", "25s", "--knobs", "batch_size", "--probe-timeout", "30s", *FAST_ARGS]


def probe_at(tmp_path, script: dict, batch_size: int, path=TINY):
    """A probe of `path` at `batch_size`, its script inspected with `script` (args, map, home) first."""
    info = inspect_workload(path, "cpu", tmp_path, 60, script={"cwd": None, **script})
    spec = ProbeSpec(id="p", workload=str(info.path), protocol=FAST, timeout_s=60, script=info.script,
                     settings=knobs.full_settings({**info.baseline, "batch_size": batch_size}))
    return info, runner.run_probe(spec, tmp_path)


def test_a_script_with_helpers_named_as_the_contract_is_analysed_as_a_script(cli, tmp_path, short_confirmation):
    # GIVEN a training script with its own build_model(args) and collate_fn(batch), and a __main__ block
    out = tmp_path / "out"
    result = cli("analyze", SCRIPTS / "helper_names.py", "-o", out, *ANALYZE_FAST, "--", "--epochs", "20")
    # THEN it runs as a script, measured, its batch size its DataLoader's
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    assert doc["workload"]["kind"] == "script" and doc["baseline"]["settings"]["batch_size"] == 8
    assert doc["baseline"]["status"] == "ok"
    assert leftovers() == []


def test_a_configurator_style_script_runs_from_its_folder_with_its_batch_size_from_its_flag(
        cli, tmp_path, monkeypatch, short_confirmation):
    # GIVEN a nanoGPT-style script run from its folder: it exec's configurator.py, reads data/ and a config file by
    # relative paths, takes --key=value, builds no DataLoader, and writes out/ckpt.pt and a log where it runs
    folder = SCRIPTS / "configurator_style"
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    monkeypatch.chdir(folder)
    out = tmp_path / "out"
    args = ["config/tiny.py", "--batch_size=12"]
    result = cli("analyze", "train.py", "-o", out, "--map", "batch_size=--batch_size=", *ANALYZE_FAST, "--", *args)
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "results.json").read_text())
    # THEN the baseline batch is the script's own, read from its command line, and counted in samples
    assert doc["baseline"]["settings"]["batch_size"] == 12 and doc["baseline"]["status"] == "ok"
    assert doc["workload"]["facts"]["extra"]["script"]["batch_size_from"] == {"flag": "--batch_size=", "value": 12}
    assert doc["baseline"]["throughput"]["unit"] == "samples/s"
    # AND what the script wrote is listed, and landed outside the caller's folder, which is as it was
    assert {"out/ckpt.pt", "train_log.txt"} <= set(doc["baseline"]["extra"]["script"]["wrote"])
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    # AND a probe at another batch passes it joined, in place of the user's, and counts its samples
    script = {"args": args, "map": {"batch_size": {"flag": "--batch_size=", "values": {}}}, "home": str(folder)}
    _, result = probe_at(tmp_path / "p", script, 24, folder / "train.py")
    assert result.status is Status.OK, result.error
    assert result.extra["script"]["argv"] == ["config/tiny.py", "--batch_size=24"] and set(result.items) == {24.0}
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before
    assert leftovers() == []


def test_a_hydra_style_script_gets_its_batch_size_as_a_key_value_override(cli, tmp_path, short_confirmation):
    # GIVEN a script taking key=value overrides that refuses a key given twice (as Hydra does)
    out = tmp_path / "out"
    args = ["training.epochs=20", "training.batch_size=8"]
    result = cli("analyze", SCRIPTS / "hydra_style.py", "-o", out, "--map", "batch_size=training.batch_size=",
                 *ANALYZE_FAST, "--", *args)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "results.json").read_text())["baseline"]["status"] == "ok"
    # THEN a probe at another batch replaces the user's own key rather than repeating it
    script = {"args": args, "map": {"batch_size": {"flag": "training.batch_size=", "values": {}}}}
    _, result = probe_at(tmp_path / "p", script, 32, SCRIPTS / "hydra_style.py")
    assert result.status is Status.OK, result.error
    assert result.extra["script"]["argv"] == ["training.epochs=20", "training.batch_size=32"]
    assert set(result.items) == {32.0}
    assert leftovers() == []
