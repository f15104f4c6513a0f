"""Scripts written for torchrun in script mode, with real children on this CPU (gloo): analysed end to end under
--nproc-per-node 2 (each rank runs the script, which joins the probe's torchrun group itself), a rank that
crashes, and one run without --nproc-per-node as `torchrun --nproc-per-node 1` would run it (a script that never
joins a group: tests/unit/test_script_ddp.py, its inspection in this process). A 2-rank probe takes ~15-20 s on
2 busy cores, mostly torchrun and its ranks importing torch."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from tune_advisor import api, knobs
from tune_advisor.api.inspection import inspect_workload
from tune_advisor.distributed.launch import TORCHRUN, layout
from tune_advisor.probe import runner
from tune_advisor.probe.result import Status
from tune_advisor.probe.spec import ProbeSpec

from ..conftest import FAST, WORKLOADS

pytestmark = pytest.mark.slow
DDP_SCRIPT = WORKLOADS / "scripts" / "ddp_script.py"


def script_spec(args, world_size=1, **seen):
    """The spec's `script` as analyze builds it (api/facade.py script_mode), plus what an inspection found."""
    return {"args": list(args), "map": {}, "cwd": None, "home": os.getcwd(), "world_size": world_size, **seen}


def left_running(workdir) -> list[int]:
    """Processes of the probes in `workdir` (torchrun's agent and ranks name its files), a moment to exit given."""
    def found():
        return [p.pid for p in psutil.process_iter(["cmdline"]) if any(str(workdir) in part for part in
                                                                        p.info["cmdline"] or [])]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and found():
        time.sleep(0.2)
    return found()


def test_a_torchrun_script_is_analysed_with_both_ranks_in_the_probes_group(tmp_path, short_confirmation):
    # GIVEN a script that joins its group from torchrun's environment, wraps its model in DDP, shards its data
    analysis = api.analyze(DDP_SCRIPT, api.AnalyzeOptions(
        out=tmp_path / "out", device="cpu", protocol=FAST, budget=90, probe_timeout=90, profile=False,
        nproc_per_node=2, only_knobs={"ddp_bucket_cap_mb"}, script_args=["--batch-size", "16", "--steps", "500"]))
    base = analysis.baseline
    assert base.status is Status.OK, base.error
    ddp, script = base.extra["distributed"], base.extra["script"]
    # THEN each rank ran the script in the probe's gloo group of 2, stopped at the same step by rank 0's decision
    assert ddp["world_size"] == 2 and ddp["backend"] == "gloo" and [r["rank"] for r in ddp["ranks"]] == [0, 1]
    assert len({r["steps"] for r in ddp["ranks"]}) == 1 and script["ended"] == "was stopped after its measured steps"
    assert script["process_group"] == {"backend_asked": "gloo", "backend": "gloo", "world_size": 2,
                                       "torchrun_env_set": []}  # torchrun's environment: nothing set by the tool
    assert ddp["ddp"]["bucket_cap_bytes"] == 25 * 2**20  # read back from the script's own wrapper
    # AND the throughput is the job's: each step trains both ranks' batches (16 each, DistributedSampler shards)
    assert set(base.items) == {32.0}
    median, _, _ = base.throughput()
    job = sum(base.items) / sum(base.step_s)
    assert 0.5 * job < median < 2 * job and job <= sum(r["items_per_s"] for r in ddp["ranks"]) * 1.0001
    # AND the inspection ran it as one process, its baseline the script's own DDP settings; its model is the MLP
    assert analysis.document["workload"]["model_class"] == "Sequential"
    assert base.settings["ddp_backend"] == "gloo" and base.settings["ddp_bucket_cap_mb"] == 25
    assert left_running(tmp_path) == []
    print(f"\nscript DDP gloo x2: job {median:,.0f} samples/s, ranks "
          f"{[round(r['items_per_s']) for r in ddp['ranks']]} samples/s, wall {base.wall_s:.1f} s")


def test_a_rank_that_crashes_fails_the_probe_with_its_own_error_and_leaves_no_process(tmp_path, monkeypatch):
    # GIVEN rank 1 of the script raising at its third step (rank 0 is left waiting in the gradient all-reduce)
    monkeypatch.setenv("DDP_SCRIPT_FAULT", "raise:1")
    spec = ProbeSpec(id="crash", workload=str(DDP_SCRIPT), settings=knobs.full_settings({"batch_size": 16}),
                     protocol=FAST, timeout_s=90, distributed=layout(2), script=script_spec(["--steps", "500"], 2))
    result = runner.run_probe(spec, tmp_path, launcher=TORCHRUN)
    # THEN the probe fails with rank 1's error and the script's line, not rank 0's broken connection
    assert result.status is Status.ERROR, result.error
    assert result.error.startswith("rank 1: ValueError: planted fault in rank 1") and "ddp_script.py" in result.error
    assert left_running(tmp_path) == []


def test_without_nproc_per_node_a_torchrun_script_runs_as_a_world_of_one(tmp_path):
    # GIVEN a script written for torchrun that reads LOCAL_RANK itself, analysed without --nproc-per-node
    info = inspect_workload(DDP_SCRIPT, "cpu", tmp_path, 60, script=script_spec(["--read-local-rank"]))
    # THEN its inspection ran it with torchrun's variables for one process, and so does its probe
    assert info.script["torchrun_env"] is True
    seen = info.facts.extra["script"]["process_group"]
    assert seen["world_size"] == 1 and seen["backend"] == "gloo"
    spec = ProbeSpec(id="one", workload=str(DDP_SCRIPT), settings=info.baseline, protocol=FAST, timeout_s=60,
                     script=info.script)
    result = runner.run_probe(spec, tmp_path)
    assert result.status is Status.OK, result.error
    assert result.extra["script"]["process_group"]["world_size"] == 1 and "distributed" not in result.extra
    assert set(result.items) == {16.0}
