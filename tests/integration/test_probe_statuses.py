"""Each probe status from a real child process, with the cause a user needs."""

import dataclasses
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tune_advisor import api
from tune_advisor.probe.result import Status

from ..conftest import BAD, FAST, WORKLOADS


def probe(path, tmp_path, protocol=FAST, timeout="60s", **settings):
    _, result = api.probe(path, settings, device="cpu", protocol=protocol, probe_timeout=timeout, workdir=tmp_path)
    return result


def test_ok_probe_has_samples_throughput_and_memory(tmp_path):
    result = probe(WORKLOADS / "tiny_mlp.py", tmp_path)
    d = result.to_dict()
    assert result.status is Status.OK and result.error is None
    assert len(d["step_time_s"]["samples"]) >= FAST.min_steps
    assert d["throughput"]["ci_low"] <= d["throughput"]["median"] <= d["throughput"]["ci_high"]
    assert d["throughput"]["unit"] == "samples/s"
    assert d["peak_memory_bytes"] > 50 * 2**20  # a Python process with torch loaded
    assert d["loss"]["finite"] is True and d["loss"]["first"] > 0
    assert result.extra["warmup_s"] > 0 and 0 <= d["data_wait_frac"] < 1


def test_cpu_allocator_failure_is_oom(tmp_path):
    result = probe(BAD / "cpu_oom.py", tmp_path, batch_size=128)
    assert result.status is Status.OOM
    assert "can't allocate memory" in result.error and "cpu_oom.py:" in result.error


def test_segfault_is_crashed_with_the_signal_and_the_user_line(tmp_path):
    result = probe(BAD / "segfault.py", tmp_path, batch_size=128)
    assert result.status is Status.CRASHED
    assert "SIGSEGV" in result.error and "segfault.py:" in result.error


def test_exception_in_a_loader_worker_is_error_with_the_users_message(tmp_path):
    # GIVEN enough steps to read the whole 256-item epoch, so index 137 is reached whatever the shuffle
    protocol = dataclasses.replace(FAST, min_steps=12, max_steps=12)
    result = probe(BAD / "dataset_raises.py", tmp_path, protocol=protocol, num_workers=1)
    assert result.status is Status.ERROR
    assert "ValueError: corrupt record at index 137: checksum mismatch" in result.error
    assert "dataset_raises.py:" in result.error and "DataLoader worker" in result.error


def test_non_finite_loss_is_diverged(tmp_path):
    result = probe(BAD / "nan_loss.py", tmp_path)
    assert result.status is Status.DIVERGED and "loss became" in result.error
    assert result.to_dict()["loss"]["finite"] is False


def test_sys_exit_in_user_code_is_an_error_not_the_end_of_the_tool(tmp_path):
    result = probe(WORKLOADS / "sys_exit.py", tmp_path)
    assert result.status is Status.ERROR and "sys.exit(3)" in result.error


def test_hang_in_loader_workers_times_out_and_leaves_no_process_behind(tmp_path):
    # WHEN the dataset hangs inside loader workers, and the child is killed as it writes its result (the temporary
    # file files.write_bytes_atomic makes beside it, created here while the child runs)
    half_written = threading.Timer(4.0, lambda: (tmp_path / "probe.result.jsonab12cd.tmp").write_text('{"st'))
    half_written.start()
    result = probe(BAD / "worker_hang.py", tmp_path, timeout="12s", num_workers=2)
    half_written.join()
    # THEN the probe is killed at its limit, with where it was stuck
    assert result.status is Status.TIMEOUT
    assert "12 s limit" in result.error and "waiting for the first batch (2 loader workers)" in result.error
    assert "killed the probe's process group (3 processes)" in result.error
    # AND neither the child nor its loader workers survive (they share the child's command line)
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
    # AND no half-written result is left beside the probe's files
    assert not list(tmp_path.glob("*.tmp"))


def test_a_probe_cut_short_by_its_time_cap_still_reports_its_steps(tmp_path):
    # GIVEN a time cap so short that fewer steps are measured than a noise figure needs (a slow model in practice)
    protocol = dataclasses.replace(FAST, min_steps=50, min_time_s=5.0, max_time_s=0.0)
    # WHEN it runs
    result = probe(WORKLOADS / "tiny_mlp.py", tmp_path, protocol=protocol)
    # THEN it is ok with its samples; the noise it could not compute is null, not a crash on writing infinity
    assert result.status is Status.OK, result.error
    assert 1 <= len(result.step_s) < 4 and result.extra["noise"] is None


def test_probe_children_see_the_environment_of_the_moment(tmp_path, monkeypatch):
    # GIVEN children forked from a long-lived zygote, WHEN the environment changes between probes
    from tune_advisor.errors import WorkloadError

    for mark in ("first", "second"):
        monkeypatch.setenv("TA_TEST_MARK", mark)
        with pytest.raises(WorkloadError) as info:
            probe(WORKLOADS / "env_mark.py", tmp_path / mark)
        # THEN each child saw the value set when it started
        assert f"mark={mark}" in str(info.value)


def test_without_the_zygote_a_probe_runs_as_a_new_process(tmp_path, monkeypatch):
    from tune_advisor.probe import runner

    def no_zygote(*args, **kwargs):
        raise AssertionError("the zygote must not be used")

    monkeypatch.setenv("TUNE_ADVISOR_NO_ZYGOTE", "1")
    monkeypatch.setattr(runner, "Zygote", no_zygote)
    result = probe(WORKLOADS / "tiny_mlp.py", tmp_path)
    assert result.status is Status.OK and result.extra["child_wall_s"] > 0


def test_a_killed_analysis_leaves_no_probe_running(tmp_path):
    # GIVEN a process running a probe that will hang (its loader workers block forever)
    script = (f"from tune_advisor import api; api.probe({str(BAD / 'worker_hang.py')!r}, {{'num_workers': 2}}, "
              f"device='cpu', probe_timeout='120s', workdir={str(tmp_path)!r})")
    parent = subprocess.Popen([sys.executable, "-c", script])
    log = tmp_path / "probe.log"
    deadline = time.monotonic() + 60
    while not (tmp_path / "probe.result.json.phase").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (tmp_path / "probe.result.json.phase").exists(), "the probe never started"

    def holding_the_log():
        found = []
        for p in psutil.process_iter():
            try:
                if any(f.path == str(log) for f in p.open_files()):
                    found.append(p.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    assert holding_the_log()  # the probe child and its workers
    # WHEN that process is killed outright (no chance to clean up)
    parent.kill()
    parent.wait()
    # THEN the probe and its loader workers go too
    deadline = time.monotonic() + 10
    while holding_the_log() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not holding_the_log()


def test_a_loader_fed_probe_measures_whole_epochs(tmp_path):
    # GIVEN 512 samples in batches of 32 (16-step epochs), two loader workers, and a protocol that could stop
    # after 3 steps
    result = probe(WORKLOADS / "tiny_io.py", tmp_path, batch_size=32, num_workers=2)
    # THEN the window is whole epochs, with one epoch start in each, wherever it began
    n = len(result.step_s)
    assert result.status is Status.OK and result.extra["epoch_steps"] == 16
    assert n % 16 == 0 and len(result.extra["epoch_start_steps"]) == n // 16


def test_a_probe_that_asks_for_a_fresh_parent_forks_from_a_new_zygote(tmp_path):
    from tune_advisor import knobs
    from tune_advisor.probe import runner
    from tune_advisor.probe.spec import ProbeSpec

    def spec(name, fresh):
        return ProbeSpec(id=name, workload=str(WORKLOADS / "tiny_mlp.py"), settings=knobs.full_settings({}),
                         protocol=FAST, fresh_parent=fresh)

    # GIVEN a zygote that has forked one probe's child
    assert runner.run_probe(spec("p1", False), tmp_path).status is Status.OK
    served = runner._zygotes[0]
    # WHEN a second probe runs as usual, THEN it forks from that same zygote
    assert runner.run_probe(spec("p2", False), tmp_path).status is Status.OK
    assert runner._zygotes[0] is served
    # WHEN a third asks for a fresh parent (as each of the confirmation's probes does), THEN a new zygote forks it
    # and the old one has ended: its memory layout, which its children share, is drawn anew
    assert runner.run_probe(spec("p3", True), tmp_path).status is Status.OK
    assert runner._zygotes[0] is not served and served.proc.poll() is not None


def test_a_probes_limit_holds_the_start_of_its_new_zygote(tmp_path, monkeypatch):
    import time as clock

    from tune_advisor import knobs
    from tune_advisor.probe import runner
    from tune_advisor.probe.spec import ProbeSpec, Protocol

    class SlowZygote(runner.Zygote):  # a loaded machine: the new parent takes 2 s more to import torch
        def __init__(self, *args, **kwargs):
            clock.sleep(2.0)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(runner, "Zygote", SlowZygote)
    # GIVEN a probe that would measure for a minute, with 5 s of the budget left, asking for a fresh parent
    spec = ProbeSpec(id="p1", workload=str(WORKLOADS / "tiny_mlp.py"), settings=knobs.full_settings({}),
                     protocol=Protocol(warmup_steps=1, min_steps=10**6, min_time_s=60.0, max_steps=10**6,
                                       max_time_s=60.0), budget_left_s=5.0, fresh_parent=True)
    started = clock.monotonic()
    result = runner.run_probe(spec, tmp_path)
    # THEN the budget stops it 5 s after it began, its parent's start included, not 5 s after its child did: the
    # wall time it reports (which the budget's clock and the confirmation's estimates use) holds that start
    assert result.status is Status.STOPPED
    assert 2.0 <= result.wall_s < 5.0 + 1.0
    assert clock.monotonic() - started - result.wall_s < 1.0


def test_the_budget_left_for_a_probe_holds_the_start_of_the_parent_it_waits_for(tmp_path, monkeypatch):
    import time as clock

    from tune_advisor import knobs
    from tune_advisor.probe import runner
    from tune_advisor.probe.spec import ProbeSpec, Protocol

    class SlowZygote(runner.Zygote):  # a loaded machine: the parent takes 2 s more to import torch
        def __init__(self, *args, **kwargs):
            clock.sleep(2.0)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(runner, "Zygote", SlowZygote)
    monkeypatch.setenv("TUNE_ADVISOR_TEST_NEW_ENVIRONMENT", "1")  # the zygote at hand no longer serves: a new one
    # GIVEN a probe that would measure for a minute, not asking for a fresh parent, with 4 s of the budget left
    spec = ProbeSpec(id="p1", workload=str(WORKLOADS / "tiny_mlp.py"), settings=knobs.full_settings({}),
                     protocol=Protocol(warmup_steps=1, min_steps=10**6, min_time_s=60.0, max_steps=10**6,
                                       max_time_s=60.0), budget_left_s=4.0)
    started = clock.monotonic()
    result = runner.run_probe(spec, tmp_path)
    took = clock.monotonic() - started
    # THEN the budget stops it 4 s after it was asked for, the parent's start included (a last probe of a 10 s
    # budget ended the plan past it so), stopped by the budget, not timed out; its wall time is its child's alone
    assert result.status is Status.STOPPED and result.extra["budget_stopped"], result.error
    assert 4.0 <= took < 4.0 + 1.0, took
    assert result.wall_s < took - 1.5


def test_a_probe_whose_new_parent_is_not_ready_by_its_deadline_stops_there(tmp_path, stuck_zygotes):
    from tune_advisor import knobs
    from tune_advisor.probe import runner
    from tune_advisor.probe.spec import ProbeSpec

    # GIVEN a probe asking for a new parent with 3 s of the budget left, and a parent whose import never ends
    spec = ProbeSpec(id="p1", workload=str(WORKLOADS / "tiny_mlp.py"), settings=knobs.full_settings({}),
                     protocol=FAST, budget_left_s=3.0, fresh_parent=True)
    result = runner.run_probe(spec, tmp_path)
    # THEN it ends at its deadline, stopped by the budget (not failed), saying where it was, and the parent is
    # ended: before, it waited on the parent's ready line for as long as the parent took (here two minutes)
    assert result.status is Status.STOPPED and result.extra["budget_stopped"]
    assert 3.0 <= result.wall_s < 4.0
    assert runner.NEW_PARENT_PHASE in result.error and "before it forked" in result.error
    assert stuck_zygotes and all(zygote.proc.poll() is not None for zygote in stuck_zygotes)
    assert all(zygote not in stuck_zygotes for zygote in runner._zygotes.values())
