"""DDP and Ray pieces without processes: merging rank results, naming the failed rank, the torchrun command, option
checks, DDP knob applicability, the TA6xx rules, and fanning independent probes out through `Session.run_many`."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from tune_advisor import knobs
from tune_advisor.distributed import launch, merge
from tune_advisor.errors import UsageError
from tune_advisor.executors import connect
from tune_advisor.planner import PlanContext, Session, plan
from tune_advisor.rules import evaluate

from ..fakes import FakeBackend, FakeClock

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def rank_result(rank: int, steps: list[float], local: list[float], wait: float = 0.001, items: float = 16.0):
    return {"status": "ok", "error": None, "unit": "samples/s", "applied": {}, "gpu": None,
            "rank": {"rank": rank, "local_rank": rank, "host": "h", "device": "cpu", "backend": "gloo"},
            "raw": {"step_s": steps, "data_wait_s": [wait] * len(steps), "h2d_s": [0.0] * len(steps),
                    "items": [items] * len(steps), "loss": [1.0 + rank] * len(steps)},
            "extra": {"local_step_s": local}, "memory": {"child_maxrss_bytes": 100 + rank}}


def test_the_job_advances_at_its_slowest_rank_and_trains_every_ranks_items():
    merged = merge.merge([rank_result(1, [0.02, 0.01, 0.03], [0.012] * 3),
                          rank_result(0, [0.01, 0.02, 0.01], [0.004] * 3)])
    raw = merged["raw"]
    assert raw["step_s"] == [0.02, 0.02, 0.03] and raw["items"] == [32.0] * 3 and raw["loss"] == [1.5] * 3
    ddp = merged["extra"]["distributed"]
    assert [r["rank"] for r in ddp["ranks"]] == [0, 1] and ddp["world_size"] == 2
    assert ddp["ranks"][1]["items_per_s"] == pytest.approx(48 / 0.06)
    # job step 0.02; own work 0.004 and 0.012: rank 0 waits 0.008 (40%), sync adds 0.008 beyond the slowest
    assert ddp["slowest_rank"] == 1 and ddp["straggler_spread"] == pytest.approx(0.4)
    assert ddp["comm_s"] == pytest.approx(0.008) and ddp["comm_frac"] == pytest.approx(0.4)
    assert merged["memory"]["child_maxrss_bytes"] == 201  # the ranks' memory together on one CPU machine


def test_a_rank_killed_by_a_signal_is_the_cause_not_the_rank_it_left_waiting(tmp_path):
    result = tmp_path / "p.result.json"
    (tmp_path / "p.result.json.rank0").write_text(json.dumps(
        {"status": "error", "error": "RuntimeError: Connection reset by peer", "rank": {"rank": 0, "finished_at": 2}}))
    log = ("[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -11 (pid: 9)\n"
           "[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 8)\n")
    assert merge.failure(result, log) == ("crashed", "rank 1 was killed by SIGSEGV without a result")
    # without a signal, the rank file that failed first names the cause
    (tmp_path / "p.result.json.rank1").write_text(json.dumps(
        {"status": "oom", "error": "CUDA out of memory", "rank": {"rank": 1, "finished_at": 1}}))
    assert merge.failure(result, "") == ("oom", "rank 1: CUDA out of memory")
    assert merge.failure(tmp_path / "other.result.json", "no summary") is None


def test_torchrun_command_runs_the_probe_child_on_every_rank():
    one = launch.command("py", launch.layout(4), ["S", "R"], "p001")
    assert one[:5] == ["py", "-m", "torch.distributed.run", "--nproc-per-node", "4"]
    assert "--standalone" in one and one[-4:] == ["-m", "tune_advisor.child", "S", "R"]
    two = launch.command("py", launch.layout(8, 2, "head:29500"), ["S", "R"], "p001")
    assert "--standalone" not in two and two[two.index("--rdzv-endpoint") + 1] == "head:29500"
    assert launch.layout(1) is None and launch.world_size(launch.layout(8, 2, "h:1")) == 16


@pytest.mark.parametrize("args, message", [
    ((0, 1, None, "cpu"), "--nproc-per-node (0) and --nnodes (1) must be at least 1"),
    ((2, 2, None, "cpu"), "--nnodes 2 needs --rdzv-endpoint"),
    ((2, 1, None, "cuda"), "--nproc-per-node 2: this machine has 1 CUDA device(s)"),
])
def test_bad_distributed_options_are_usage_errors(monkeypatch, args, message):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        launch.check(*args)


def test_a_torch_without_distributed_is_a_usage_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    with pytest.raises(UsageError, match="no torch.distributed"):
        launch.check(2, 1, None, "cpu")


def test_ddp_knobs_apply_only_to_distributed_probes():
    mlp, single = knobs.WorkloadFacts(), knobs.DeviceFacts("cpu")
    ddp = knobs.DeviceFacts("cpu", world_size=2)
    assert "single process" in knobs.not_applicable("static_graph", True, mlp, single)
    assert knobs.not_applicable("static_graph", True, mlp, ddp) is None
    assert knobs.not_applicable("ddp_bucket_cap_mb", 25, mlp, single) is None  # the default always applies
    assert "NCCL needs CUDA" in knobs.not_applicable("ddp_backend", "nccl", mlp, ddp)
    assert knobs.not_applicable("ddp_backend", "nccl", mlp, knobs.DeviceFacts("cuda", world_size=8)) is None


def test_executor_options_are_checked(monkeypatch, tmp_path):
    assert connect("local", None, "cpu", tmp_path) is None
    with pytest.raises(UsageError, match="--executor dask: expected one of local, ray"):
        connect("dask", None, "cpu", tmp_path)
    with pytest.raises(UsageError, match="--ray-address needs --executor ray"):
        connect("local", "auto", "cpu", tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(UsageError, match=r"pip install 'tune-advisor\[ray\]'"):
        connect("ray", None, "cpu", tmp_path)


def test_cli_without_ray_installed_exits_2_naming_the_extra(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    result = cli("analyze", GOLDEN.parent / "workloads" / "tiny_mlp.py", "-o", tmp_path, "--executor", "ray")
    assert result.exit_code == 2 and "pip install 'tune-advisor[ray]'" in result.output
    assert "Traceback" not in result.output
    result = cli("probe", GOLDEN.parent / "workloads" / "tiny_mlp.py", "--nproc-per-node", "-1")
    assert result.exit_code == 2 and "must be at least 1" in result.output


# --- rules ----------------------------------------------------------------------------------------------------


def golden(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text())


def test_gradient_sync_bound_quotes_the_measured_share_and_labels_its_estimate():
    found = {f["code"]: f for f in evaluate(golden("ddp_gloo.results.json"))}
    f = found["TA601"]
    ddp = golden("ddp_gloo.results.json")["baseline"]["extra"]["distributed"]
    assert f"{ddp['comm_frac']:.0%} of each DDP step" in f["message"]
    assert f["gain"]["measured"] is False and "upper bound" in f["gain"]["basis"]
    assert "no_sync()" in f["fix"]["snippet"] and "TA602" not in found


def test_gradient_sync_bound_measures_the_gain_of_a_faster_ddp_variant():
    # GIVEN the real run, with its gradient_as_bucket_view=True probe made twice as fast
    doc = golden("ddp_gloo.results.json")
    for p in doc["probes"]:
        if p["settings"]["gradient_as_bucket_view"]:
            p["step_time_s"]["samples"] = [x / 2 for x in p["step_time_s"]["samples"]]
            doc["recommended"] = p  # as the planner would then recommend it
    f = next(f for f in evaluate(doc) if f["code"] == "TA601")
    # THEN the finding recommends that knob with a measured gain
    assert f["fix"]["settings"] == {"gradient_as_bucket_view": True}
    assert f["gain"]["measured"] and f["gain"]["speedup"]["median"] > 1.5


def test_rank_imbalance_names_the_straggler_and_its_cause():
    doc = golden("rules/synthetic_ddp_straggler.results.json")
    f = next(f for f in evaluate(doc) if f["code"] == "TA602")
    assert f["message"].startswith("rank 1 is the straggler") and f["evidence"]["slowest_rank"] == 1
    assert f["fix"]["settings"] == {} and f["gain"]["measured"] is False
    # a straggler that waits longest for data is told to add loader workers
    doc = copy.deepcopy(doc)
    for p in doc["probes"]:
        ddp = (p.get("extra") or {}).get("distributed")
        if ddp:
            ddp["ranks"][1]["data_wait_frac"] = 0.6  # 2.6 ms of its 4.4 ms step: most of its extra 2.8 ms
    f = next(f for f in evaluate(doc) if f["code"] == "TA602")
    assert f["fix"]["settings"] == {"num_workers": 2} and "not tried in this run: num_workers=2" in f["message"]


# --- fanning out ----------------------------------------------------------------------------------------------


def test_a_grid_goes_out_at_once_through_an_executor_that_runs_probes_side_by_side():
    # GIVEN a backend that, like Ray's, runs 4 probes side by side and hands them back in another order
    backend = FakeBackend(lambda s: 1000.0 * s["batch_size"] / 16, width=4)
    session = Session(backend, None, clock=FakeClock())
    ctx = PlanContext(baseline=knobs.full_settings({"batch_size": 16}),
                      search={"batch_size": [16, 32, 64], "num_workers": [0, 1]},
                      workload=knobs.WorkloadFacts(dataset_len=10_000), device=knobs.DeviceFacts("cpu"))
    outcome = plan(ctx, session, "grid")
    # THEN the 5 combinations besides the baseline went out as one batch, each recorded once, ids unique
    assert backend.batches == [5]
    grid = [p for p in outcome.probes if p.role == "grid"]
    assert len(grid) == 5 and len({p.id for p in outcome.probes}) == len(outcome.probes)
    assert outcome.recommended.settings["batch_size"] == 64


def test_each_rank_keeps_the_utilisation_of_its_own_gpu():
    # GIVEN two ranks whose samplers matched different GPUs (by UUID) and saw different utilisation
    ranks = [rank_result(0, [0.01] * 3, [0.004] * 3), rank_result(1, [0.01] * 3, [0.006] * 3)]
    for r, util, uuid in zip(ranks, (91.0, 47.0), ("GPU-aaaa", "GPU-bbbb")):
        r["gpu"] = {"util_mean": util, "util_p50": util, "memory_used_max_bytes": 2**30,
                    "memory_total_bytes": 2**34, "device_matched_by": f"uuid {uuid}", "samples": 10}
    merged = merge.merge(ranks)
    # THEN the job keeps rank 0's GPU summary, and every rank's own figures sit beside it and in the rank table
    assert merged["gpu"]["samples"] == 10
    assert [g["util_mean"] for g in merged["gpu"]["ranks"]] == [91.0, 47.0]
    per_rank = merged["extra"]["distributed"]["ranks"]
    assert [r["gpu"]["device_matched_by"] for r in per_rank] == ["uuid GPU-aaaa", "uuid GPU-bbbb"]
    # AND CPU ranks (no GPU) have none
    assert merge.merge([rank_result(0, [0.01] * 3, [0.004] * 3)])["extra"]["distributed"]["ranks"][0]["gpu"] is None
