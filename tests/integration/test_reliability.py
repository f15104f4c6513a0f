"""Nothing is lost (SPEC §9): `analyze` killed at random points, resumed, run twice at once, and fed damaged files."""

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tune_advisor import files, results, rundir

from ..conftest import ROOT, WORKLOADS, tagged_processes

FAST_FLAGS = ["--device", "cpu", "--min-time", "0.1", "--min-steps", "3", "--warmup", "1", "--no-profile"]
SHORT_CLI = ROOT / "tests" / "short_cli.py"
KILL_POINTS = 4  # each of the three ways a run is ended, one twice; each point a CLI start (seconds)


def no_process_left(tag: str, wait_s: float = 10.0) -> bool:
    """The zygote exits when its parent's pipe closes, and kills a child it was running: give that a moment."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not tagged_processes(tag):
            return True
        time.sleep(0.1)
    return False


def saved_probes(out) -> list[dict]:
    path = out / "results.json"
    return results.read(path)["probes"] if path.exists() else []


def wait_for(condition, proc, timeout_s=120.0) -> bool:
    """Poll `condition` until true (True) or `proc` exits first (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    raise AssertionError("the run neither got there nor ended")


def test_analyze_killed_at_random_points_is_readable_renders_and_resumes_without_rerunning(cli, tmp_path):
    rng = random.Random(20240909)
    out = tmp_path / "out"
    tag = uuid.uuid4().hex
    env = {**os.environ, "TUNE_ADVISOR_TEST_TAG": tag}
    # Probes of at least 0.6 s: the 12 of the grid outlast the kill window (up to 3 s, plus the refused second run)
    # even on a fast, idle machine.
    # The CLI as a process of its own, its confirmation as short as the in-process tests' (tests/short_cli.py)
    command = [sys.executable, str(SHORT_CLI), "analyze", str(WORKLOADS / "tiny_grid.py"), "-o", str(out),
               "--strategy", "grid", "--budget", "2m", *FAST_FLAGS, "--min-time", "0.6", "--quiet"]
    first_seen: dict[str, tuple[dict, int | None]] = {}  # probe id -> (its saved dict, its result file's mtime)
    outcomes = []

    def check_nothing_rerun():
        for probe in saved_probes(out):
            result_file = out / "probes" / f"{probe['id']}.result.json"
            mtime = result_file.stat().st_mtime_ns if result_file.exists() else None
            saved, seen_mtime = first_seen.setdefault(probe["id"], (probe, mtime))
            assert probe == saved and mtime == seen_mtime, f"{probe['id']} was run again"

    for point in range(KILL_POINTS):
        how = ["SIGINT", "SIGKILL", "SIGINT twice"][point % 3]
        before = len(saved_probes(out))
        # Ctrl-C's default action for the CLI, as in a terminal: an ignored SIGINT is inherited across exec, and an
        # earlier in-process `analyze` interrupted in this test session leaves this process ignoring it.
        proc = subprocess.Popen(command + (["--resume"] if point else []), env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        lock = out / rundir.LOCK_NAME
        # The kill point: a random time after the run took the folder, or just after its next probe is saved.
        running = wait_for(lambda: lock.exists() and lock.read_text().strip() == str(proc.pid), proc)
        if running and rng.random() < 0.5:
            time.sleep(rng.uniform(0.0, 3.0))
        elif running:
            running = wait_for(lambda: len(saved_probes(out)) > before, proc)
            time.sleep(rng.uniform(0.0, 0.4))
        if point == 0 and running:  # meanwhile, a second run into the same folder is refused, not interleaved
            second = cli("analyze", WORKLOADS / "tiny_grid.py", "-o", out, *FAST_FLAGS)
            assert second.exit_code == 2 and f"in use by another tune-advisor run (pid {proc.pid})" in second.output
        if how == "SIGKILL":
            proc.kill()  # the CLI process alone, as `kill -9` does
        else:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's foreground process group
            if how == "SIGINT twice":
                time.sleep(rng.uniform(0.05, 0.5))
                try:
                    os.killpg(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        _, stderr = proc.communicate(timeout=60)
        outcomes.append((how, proc.returncode, len(saved_probes(out))))
        # THEN it ended as signalled (unless it had finished), with no traceback and no process left behind
        if proc.returncode != 0:
            assert proc.returncode == (-signal.SIGKILL if how == "SIGKILL" else 130), (how, stderr)
        assert "Traceback" not in stderr, stderr
        assert no_process_left(tag), [p.cmdline() for p in tagged_processes(tag)]
        # AND the folder is readable, renders, and holds every probe it held before, unchanged
        if (out / "results.json").exists():
            check_nothing_rerun()
            assert cli("report", out / "results.json", "--quiet").exit_code == 0
        if how != "SIGKILL":  # a Ctrl-C cleans up after itself; a SIGKILL mid-write may leave a temp file
            assert not list(out.glob("*.tmp")), how

    # WHEN the run is resumed to the end
    done = subprocess.run(command + ["--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # THEN it completes with every probe saved before kept as it was, none run twice, nothing left behind
    document = results.read(out / "results.json")
    assert document["run"]["state"] == "complete" and document["recommended"] is not None
    check_nothing_rerun()
    ids = [p["id"] for p in document["probes"]]
    assert ids == [f"p{i:03d}" for i in range(1, len(ids) + 1)]
    assert {p["role"] for p in document["probes"]} >= {"baseline", "grid"}
    last = document["run"]["resumed"][-1]
    assert last["discarded"] == [] and len(last["reused"]) == outcomes[-1][2]
    assert not list(out.glob("*.tmp")) and not (out / rundir.LOCK_NAME).exists()
    assert no_process_left(tag)
    assert len(outcomes) == KILL_POINTS and {how for how, _, _ in outcomes} == {"SIGINT", "SIGKILL", "SIGINT twice"}
    assert sum(rc in (130, -signal.SIGKILL) for _, rc, _ in outcomes) >= KILL_POINTS - 2, outcomes
    print("kill points:", outcomes)


@pytest.fixture(scope="module")
def finished_template(tmp_path_factory):
    """One short complete run of a copy of tiny_mlp, made once for the tests below."""
    from typer.testing import CliRunner

    from tune_advisor.cli import app

    base = tmp_path_factory.mktemp("finished")
    workload = base / "tiny.py"
    workload.write_text((WORKLOADS / "tiny_mlp.py").read_text())
    result = CliRunner().invoke(app, ["analyze", str(workload), "-o", str(base / "out"), "--budget", "1s",
                                      *FAST_FLAGS, "--quiet"])
    assert result.exit_code == 0, result.output
    return base


@pytest.fixture
def finished_run(finished_template, tmp_path):
    """A copy of the finished run and its workload file, for a test to damage or edit."""
    shutil.copytree(finished_template, tmp_path, dirs_exist_ok=True)
    return tmp_path / "tiny.py", tmp_path / "out"


def test_resume_refuses_when_the_workload_settings_or_hardware_changed(cli, finished_run):
    workload, out = finished_run
    # GIVEN the same command: resuming reuses every probe and runs none
    before = [p["id"] for p in results.read(out / "results.json")["probes"]]
    again = cli("analyze", workload, "-o", out, "--budget", "1s", *FAST_FLAGS, "--resume")
    assert again.exit_code == 0, again.output
    assert f"had finished; its {len(before)} finished probe" in again.output
    assert results.read(out / "results.json")["run"]["resumed"][-1] == {"reused": before, "discarded": []}
    # WHEN the settings space differs: refused, saying what changed
    other = cli("analyze", workload, "-o", out, "--budget", "1s", *FAST_FLAGS, "--min-steps", "4", "--resume")
    assert other.exit_code == 2 and "protocol changed" in other.output and "Run without --resume" in other.output
    # WHEN the hardware fingerprint differs
    document = results.read(out / "results.json")
    document["environment"]["fingerprint"] = "0000"
    results.write_atomic(out / "results.json", document)
    other = cli("analyze", workload, "-o", out, "--budget", "1s", *FAST_FLAGS, "--resume")
    assert other.exit_code == 2 and "the hardware changed (fingerprint 0000 then" in other.output
    # WHEN the workload file was edited
    workload.write_text(workload.read_text() + "\n# edited\n")
    other = cli("analyze", workload, "-o", out, "--budget", "1s", *FAST_FLAGS, "--resume")
    assert other.exit_code == 2 and "the workload file changed" in other.output
    assert "Traceback" not in other.output


def edited(change):
    """A hand edit: `change(document)` applied to the parsed file."""
    def damage(text):
        document = json.loads(text)
        change(document)
        return json.dumps(document)
    return damage


@pytest.mark.parametrize("damage, message", [
    (lambda text: text[: len(text) // 2], "it ends early: the file was cut off"),
    (edited(lambda d: d.update(schema_version=7)), "written by a newer tune-advisor (schema 7"),
    (edited(lambda d: d["probes"][0].update(status="fine")), "status 'fine' is not one of"),
    (edited(lambda d: d.update(probes={"p001": d["probes"][0]})), "'probes' must be a list, not an object"),
    # the typed record (record.py) names the field: resuming and rendering both need it whole
    (edited(lambda d: d["probes"][0].update(step_time_s=[1, 2])), "probes[0].step_time_s: input should be a valid"),
])
def test_a_damaged_results_json_gives_a_clear_message_and_exit_2(cli, finished_run, damage, message):
    _, out = finished_run
    path = out / "results.json"
    path.write_text(damage(path.read_text()))
    for args in (["analyze", finished_run[0], "-o", out, *FAST_FLAGS, "--resume"], ["report", path]):
        result = cli(*args)
        assert result.exit_code == 2 and message in result.output, (args[0], result.output)
        assert isinstance(result.exception, SystemExit)  # no traceback: a message and an exit code


def test_an_unwritable_output_folder_is_refused_before_any_probe(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = cli("analyze", WORKLOADS / "tiny_mlp.py", "-o", blocker / "out", *FAST_FLAGS)
    assert result.exit_code == 2 and "cannot write to the output folder" in result.output
    if os.geteuid() != 0:  # root writes anywhere
        locked_dir = tmp_path / "read-only"
        locked_dir.mkdir(mode=0o500)
        result = cli("analyze", WORKLOADS / "tiny_mlp.py", "-o", locked_dir / "out", *FAST_FLAGS)
        assert result.exit_code == 2 and "Permission denied" in result.output


def test_a_full_disk_mid_run_keeps_the_last_good_results_and_exits_2(cli, tmp_path, monkeypatch):
    # GIVEN a disk that fills up after the first save of results.json (fsync is where a full disk shows)
    real_fsync, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)  # every atomic write fsyncs there (results.json first)
    out = tmp_path / "out"
    result = cli("analyze", WORKLOADS / "tiny_mlp.py", "-o", out, "--budget", "1s", *FAST_FLAGS, "--quiet")
    # THEN a clear message and exit 2, the last good results.json intact, no temporary file, the folder free
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert "No space left on device; the previous version is kept" in result.output
    assert results.read(out / "results.json")["probes"] == []
    assert not list(out.glob("*.tmp")) and not (out / rundir.LOCK_NAME).exists()
