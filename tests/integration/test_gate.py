"""`tune-advisor baseline` and `gate` end to end: exit codes, outputs, refusals, and real child probes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import junitparser
import pytest

from tune_advisor import results
from tune_advisor.errors import UsageError
from tune_advisor.gate import baseline as bl
from tune_advisor.gate import run_gate
from tune_advisor.probe.result import ProbeResult, Status

from ..conftest import FAST, WORKLOADS

TINY = WORKLOADS / "tiny_mlp.py"
FAST_OPTIONS = ["--min-time", "0.1", "--min-steps", "3", "--warmup", "1", "--max-time", "2"]


def one_line_error(result, says: str) -> None:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.output
    assert "Traceback" not in result.output


def foreign_baseline(path, **env_changes):
    """A valid baseline file whose machine differs from this one (no probe needed to make it)."""
    from tune_advisor import environment

    env = {**environment.collect("cpu"), **env_changes}
    probes = [ProbeResult("baseline-1", {"batch_size": 16}, Status.OK,
                          raw={"step_s": [0.01] * 5, "items": [16.0] * 5}, peak_memory_bytes=2**28)]
    doc = bl.new_document(command=[], environment=env, workload={"path": str(TINY)}, settings={"batch_size": 16},
                          protocol=FAST, probes=probes)
    path.parent.mkdir(parents=True, exist_ok=True)
    results.write_atomic(path, doc)
    return path


@pytest.mark.parametrize("content, says", [
    (None, "no such baseline file; record one with: tune-advisor baseline"),
    ("{not json", "not a readable baseline (corrupt JSON"),
    (json.dumps({"schema_version": 7, "kind": "tune-advisor-baseline"}), "written by a newer tune-advisor"),
])
def test_an_unusable_baseline_exits_2_with_one_line(cli, tmp_path, content, says):
    # GIVEN a missing, corrupt or newer baseline file
    path = tmp_path / "baseline.json"
    if content is not None:
        path.write_text(content)
    # WHEN the gate is asked to use it
    result = cli("gate", TINY, "--baseline", path, "-o", tmp_path / "out")
    # THEN it exits 2 with one line saying what to do, before measuring anything
    assert result.exit_code == 2
    one_line_error(result, says)


@pytest.mark.parametrize("args, says", [
    (["--check", "throughput:fast"], "--check 'throughput:fast': cannot read the limit"),
    (["--check", "throughput:5%"], "compare with a reference: give --baseline FILE"),
    ([], "nothing to check"),
    (["--check", "throughput:>=1", "--rounds", "0"], "--rounds 0"),
])
def test_bad_check_strings_and_options_exit_2(cli, args, says):
    result = cli("gate", TINY, *args)
    assert result.exit_code == 2
    one_line_error(result, says)


def test_a_baseline_from_other_hardware_is_refused_with_exit_3_and_every_output_says_why(cli, tmp_path,
                                                                                         monkeypatch):
    # GIVEN a baseline recorded on a 64-core machine with another torch, and CI's step summary file
    path = foreign_baseline(tmp_path / "perf" / "baseline.json", cpu_count=64, torch="2.0.0")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    # WHEN the gate runs against it
    result = cli("gate", TINY, "--baseline", path, "-o", tmp_path / "out", "--junit", tmp_path / "gate.xml")
    # THEN it refuses with its own exit code, naming the differences and the way out, and runs no probe
    assert result.exit_code == 3, result.output
    assert "CPU cores: 64 (baseline) vs" in result.output and "torch: 2.0.0 (baseline)" in result.output
    assert "--allow-other-hardware" in result.output and "Traceback" not in result.output
    gate = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert (gate["verdict"], gate["exit_code"], gate["candidate"]["rounds"]) == ("refused", 3, [])
    assert {d["fact"] for d in gate["hardware"]["differences"]} == {"CPU cores", "torch"}
    suite = list(junitparser.JUnitXml.fromfile(str(tmp_path / "gate.xml")))[0]
    assert suite.errors == 2  # both default checks, not run
    assert "refused" in summary.read_text()


def test_against_a_ref_that_is_not_there_explains_shallow_clones(tmp_path):
    # GIVEN a git repository holding the workload, and a ref that does not exist in it
    repo = git_repo(tmp_path)
    # WHEN the gate is asked to compare against it  THEN exit 2 tells how to fetch it in CI
    with pytest.raises(UsageError) as info:
        run_gate(repo / "model.py", against="origin/main", checks=["throughput:5%"], device="cpu", protocol=FAST)
    assert info.value.exit_code == 2
    assert "--against origin/main: no such commit" in str(info.value) and "fetch-depth: 0" in str(info.value)


def git_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(TINY, repo / "model.py")
    for args in (["init", "-q"], ["add", "model.py"],
                 ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "model"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    return repo


@pytest.mark.slow
def test_baseline_then_gate_pass_and_write_every_output(cli, tmp_path, monkeypatch):
    # GIVEN a baseline of two rounds recorded with the CLI
    path = tmp_path / "perf" / "baseline.json"
    recorded = cli("baseline", TINY, "-o", path, "--rounds", "2", "--device", "cpu", *FAST_OPTIONS)
    assert recorded.exit_code == 0, recorded.output
    doc = json.loads(path.read_text())
    assert len(doc["rounds"]) == 2 and doc["environment"]["fingerprint"] and doc["settings"]["batch_size"] == 16
    assert doc["summary"]["throughput"]["unit"] == "samples/s" and doc["protocol"]["max_time_s"] == 2
    # WHEN the unchanged workload is gated with checks no machine noise can trip, and CI's summary file set
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    # (throughput:90% warned once, on a machine running two test processes at once: the rounds a minute apart)
    result = cli("gate", TINY, "--baseline", path, "--rounds", "1", "--check", "throughput:50%",
                 "--check", "peak_memory:100%", "--check", "throughput:>=1", "-o", tmp_path / "out",
                 "--junit", tmp_path / "gate.xml")
    # THEN it passes, and gate.json, JUnit and the step summary all carry the verdict and the numbers
    assert result.exit_code == 0, result.output
    assert "gate passed" in result.output and "single round" in result.output  # the 1-round warning
    gate = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert gate["verdict"] == "pass" and gate["mode"] == "stored" and len(gate["candidate"]["rounds"]) == 1
    assert [c["status"] for c in gate["checks"]] == ["pass", "pass", "pass"]
    assert gate["checks"][0]["figures"]["ratio"]["ci_low"] > 0
    suite = list(junitparser.JUnitXml.fromfile(str(tmp_path / "gate.xml")))[0]
    assert (suite.tests, suite.failures, suite.errors) == (3, 0, 0)
    assert "| `throughput:50%` | ✅ pass |" in summary.read_text()


@pytest.fixture
def local_ray():
    ray = pytest.importorskip("ray", reason="the ray extra: pip install 'tune-advisor[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_the_gate_runs_its_probes_as_ray_tasks(cli, tmp_path, local_ray):
    # GIVEN a local Ray instance, and an absolute check any machine meets
    # WHEN the gate measures the workload with --executor ray, in one short round
    result = cli("gate", TINY, "--check", "throughput:>=1", "--rounds", "1", "--device", "cpu", "--min-time", "0.1",
                 "--min-steps", "3", "--warmup", "1", "--executor", "ray", "-o", tmp_path / "out")
    # THEN it passes on a probe a Ray task ran
    assert result.exit_code == 0, result.output
    gate = json.loads((tmp_path / "out" / "gate.json").read_text())
    (probe,) = gate["candidate"]["rounds"]
    assert gate["verdict"] == "pass" and probe["status"] == "ok"
    assert probe["extra"]["executor"]["name"] == "ray"


@pytest.mark.slow
def test_a_slower_working_tree_fails_against_the_committed_version_measured_interleaved(tmp_path):
    # GIVEN a committed workload, and a working-tree change that adds eight 384x384 matmuls to every step: compute,
    # not a sleep, so that a busy machine slows both versions alike (a sleep does not slow down, the tiny reference
    # step does: with a 30 ms sleep, one of three rounds read far off the others in a full test run, 0.076x with
    # a 95% CI of 0.005-1.625, a 92% drop "not significant")
    repo = git_repo(tmp_path)
    model = repo / "model.py"
    model.write_text(model.read_text() + (
        "\n\nimport torch.nn.functional as F\n\n\n"
        "def compute_loss(model, batch):\n    x, y = batch\n    w = torch.ones(384, 384)\n"
        "    for _ in range(8):\n        w = torch.tanh(w @ w / 384)\n"
        "    return F.cross_entropy(model(x), y) + 0 * w.sum()\n"))
    # WHEN the gate compares it with HEAD in this job, in the default 3 rounds and more while undecided (three
    # rounds read 0.27x, 0.17x and 0.30x on a quiet machine; in a CI run one read far off the others, and three
    # alone passed: 0.261x [0.062, 1.166])
    result = run_gate(model, against="HEAD", checks=["throughput:20%"], device="cpu", protocol=FAST)
    # THEN both versions were measured alternately, and the regression fails the gate with its numbers
    assert result.document["mode"] == "interleaved"
    measured = result.document["rounds_measured"]
    assert 3 <= measured <= 7 and len(result.document["candidate"]["rounds"]) == measured
    assert [p["id"] for p in result.document["reference_rounds"]] == [f"reference-{i}" for i in range(1, measured + 1)]
    assert result.exit_code == 1, result.message()
    assert "throughput dropped" in result.failures[0] and "95% CI" in result.failures[0]
    # AND the user's repository was not touched: no worktree, nothing staged
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout.strip() == "M model.py"
    worktrees = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True)
    assert len(worktrees.stdout.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_perf_budget_marker_fails_a_test_with_the_gates_message(tmp_path):
    # GIVEN a user's test file with two budgets: one any machine meets, one no machine meets
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_speed.py").write_text(
        "import pytest\n\n"
        f"FAST = {{'warmup_steps': 1, 'min_steps': 3, 'min_time_s': 0.1, 'max_time_s': 2.0}}\n\n"
        f"@pytest.mark.perf_budget(workload={str(TINY)!r}, min_throughput=1, rounds=1, device='cpu', "
        "protocol=FAST)\ndef test_fast_enough():\n    pass\n\n"
        f"@pytest.mark.perf_budget(workload={str(TINY)!r}, min_throughput=1e9, rounds=1, device='cpu', "
        "protocol=FAST, settings={'batch_size': 8})\ndef test_impossible_budget():\n    pass\n")
    # WHEN pytest runs it (the plugin comes from the installed entry point)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    # THEN the impossible budget fails with the gate's numbers and no traceback; the other passes
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "1 failed, 1 passed" in output
    assert "perf_budget: 1 of 1 checks failed" in output
    assert "throughput:>=1000000000.0: throughput below the floor" in output
    assert "Traceback" not in output and "site-packages" not in output
