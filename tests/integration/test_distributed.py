"""DDP probes through torchrun on this CPU (gloo, 2 processes), and probes fanned out as tasks of a local Ray
instance. Real child processes: a DDP probe takes ~10-20 s on 2 cores, mostly torchrun and its ranks importing
torch."""

from __future__ import annotations

import time

import psutil
import pytest

from tune_advisor import api, knobs, results
from tune_advisor.distributed.launch import TORCHRUN, layout
from tune_advisor.probe.result import ProbeResult, Status
from tune_advisor.probe.runner import run_probe
from tune_advisor.probe.spec import ProbeSpec

from ..conftest import FAST, WORKLOADS

pytestmark = pytest.mark.slow
TINY_DDP = WORKLOADS / "tiny_ddp.py"


def ddp_probe(workdir, timeout_s: float = 120) -> ProbeResult:
    """A 2-rank probe straight through the runner (the failure tests need no inspection of the workload)."""
    spec = ProbeSpec(id="ddp", workload=str(TINY_DDP), settings=knobs.full_settings({"batch_size": 16}),
                     protocol=FAST, timeout_s=timeout_s, distributed=layout(2))
    return run_probe(spec, workdir, launcher=TORCHRUN)


def test_a_ddp_probe_reports_every_rank_and_the_job_throughput(tmp_path):
    # GIVEN a 2-process DDP probe on the CPU with non-default DDP knobs
    _, result = api.probe(TINY_DDP, {"ddp_bucket_cap_mb": 1, "static_graph": True}, device="cpu",
                          protocol=FAST, workdir=tmp_path, nproc_per_node=2)
    assert result.status is Status.OK, result.error
    ddp = result.extra["distributed"]
    # THEN it ran as 2 gloo ranks, and the knobs took effect in DDP itself
    assert ddp["world_size"] == 2 and ddp["backend"] == "gloo"
    assert ddp["ddp"] == {"bucket_cap_bytes": 2**20, "static_graph": True, "gradient_as_bucket_view": False}
    ranks = ddp["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and len({r["steps"] for r in ranks}) == 1
    for r in ranks:  # per-rank metrics: step time, data wait, own work without gradient sync
        assert r["step_time_s"]["median"] > 0 and 0 <= r["data_wait_frac"] < 1 and r["local_step_s"] > 0
        assert len(r["raw"]["step_s"]) == r["steps"] == len(result.step_s)
    # AND the job advances at its slowest rank each step, training both ranks' samples
    for i, step in enumerate(result.step_s):
        assert step == max(r["raw"]["step_s"][i] for r in ranks)
    assert set(result.items) == {32.0}  # batch_size 16 on each of 2 ranks
    job = sum(result.items) / sum(result.step_s)
    assert job <= sum(r["items_per_s"] for r in ranks) * 1.0001
    median, low, high = result.throughput()
    assert low <= median <= high and 0.5 * job < median < 2 * job
    assert 0 <= ddp["comm_frac"] < 1 and ddp["straggler_spread"] >= 0 and ddp["slowest_rank"] in (0, 1)
    print(f"\nDDP gloo x2: rank step medians {[round(r['step_time_s']['median'] * 1e3, 2) for r in ranks]} ms, "
          f"local {[round(r['local_step_s'] * 1e3, 2) for r in ranks]} ms, job {median:,.0f} samples/s "
          f"[{low:,.0f}, {high:,.0f}], comm {ddp['comm_frac']:.0%}, spread {ddp['straggler_spread']:.0%}, "
          f"wall {result.wall_s:.1f} s")


@pytest.mark.parametrize("fault, status, message", [
    ("raise:1", Status.ERROR, "rank 1: ValueError: planted fault in rank 1"),
    ("segv:1", Status.CRASHED, "rank 1 was killed by SIGSEGV"),
])
def test_a_failing_rank_is_named_with_its_cause(tmp_path, monkeypatch, fault, status, message):
    # GIVEN a workload that fails in rank 1 only (rank 0 is left waiting in the gradient all-reduce)
    monkeypatch.setenv("RANK_FAULT", fault)
    result = ddp_probe(tmp_path)
    # THEN the probe fails with that rank's cause, not rank 0's broken connection
    assert result.status is status and result.error.startswith(message), result.error
    assert "tiny_ddp.py" in result.error or status is Status.CRASHED


def test_a_hung_ddp_probe_is_killed_with_all_its_ranks(tmp_path, monkeypatch):
    # GIVEN rank 1 stuck in its first step and a 10 s limit
    monkeypatch.setenv("RANK_FAULT", "hang:1")
    result = ddp_probe(tmp_path, timeout_s=10)
    assert result.status is Status.TIMEOUT
    # THEN no rank outlives the probe (torchrun starts ranks in sessions of their own)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _probe_processes(tmp_path):
        time.sleep(0.2)
    assert _probe_processes(tmp_path) == []


def _probe_processes(workdir) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if any(str(workdir) in part for part in p.info["cmdline"] or []):
            found.append(p.info["pid"])
    return found


@pytest.fixture
def local_ray():
    ray = pytest.importorskip("ray", reason="the ray extra: pip install 'tune-advisor[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_a_grid_fans_out_over_ray_into_the_same_results_json(local_ray, tmp_path, short_confirmation):
    # GIVEN a grid of 4 applicable combinations and a local Ray instance with 2 CPUs
    started = time.monotonic()
    result = api.analyze(WORKLOADS / "tiny_search.py", api.AnalyzeOptions(
        out=tmp_path / "out", device="cpu", strategy="grid", protocol=FAST, budget=None, profile=False,
        executor="ray"))
    saved = results.read(tmp_path / "out" / "results.json")
    ran = [p for p in saved["probes"] if p["status"] != "skipped"]
    # THEN the 4 combinations ran as Ray tasks and came back as ordinary PROBE objects
    grid = {(p["settings"]["batch_size"], p["settings"]["num_workers"]) for p in ran
            if p["role"] in ("baseline", "grid")}
    assert grid == {(16, 0), (16, 1), (32, 0), (32, 1)}
    schema = set(ProbeResult("x", {}, Status.OK).to_dict())
    for p in ran:
        assert schema <= set(p) and p["status"] == "ok", p.get("error")
        assert p["extra"]["executor"]["name"] == "ray" and p["throughput"]["median"] > 0
    assert saved["execution"]["executor"] == "ray" and result.recommended is not None
    assert len({p["id"] for p in saved["probes"]}) == len(saved["probes"])
    print(f"\nRay: {len(ran)} probes in {time.monotonic() - started:.1f} s; "
          f"throughputs {[round(p['throughput']['median']) for p in ran]} samples/s")
