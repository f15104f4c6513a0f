"""Script mode for scripts written for torchrun, in this process: the script's own process group (script/group.py)
as a world of one on gloo, the DDP knobs put into its wrapper, its destroy put off for the gather, the ranks'
agreement on when to stop (driver.Steps with a rank), and a script rank's result written through
distributed/rank.py `finish`. The multi-rank runs are tests/integration/test_script_ddp.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tune_advisor import knobs
from tune_advisor.distributed import rank as rank_mod
from tune_advisor.probe import evidence
from tune_advisor.probe.spec import ProbeSpec, Protocol
from tune_advisor.script import driver, group
from tune_advisor.script.hooks import Hooks, ScriptStop

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="this torch build has no torch.distributed")
HERE = Path(__file__)
SCRIPTS = HERE.parents[1] / "workloads" / "scripts"


@pytest.fixture
def no_torchrun_env(monkeypatch):
    for key in group.TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    yield
    if dist.is_initialized():  # a failed test must not leave the next one a group
        dist.destroy_process_group()


def torchrun_env_of_one(monkeypatch):
    for key, value in group.world_of_one({}, group.free_port()).items():
        monkeypatch.setenv(key, value)


def installed(settings=None, world_size=1, baseline=None, mapped=(), apply_knobs=True, up_front=False):
    hooks = Hooks(HERE, knobs.full_settings(settings or {}), "cpu", apply_knobs, set(mapped), None,
                  on_step=lambda optimizer: None)
    hooks.group = group.GroupHooks(hooks.settings, "cpu", apply_knobs, set(mapped), world_size, baseline,
                                   up_front=up_front)
    return hooks.install()


def test_world_of_one_gives_only_the_variables_torchrun_would_set_that_are_missing():
    assert group.world_of_one({}, 1234) == {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                                            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                                            "MASTER_PORT": "1234"}
    assert group.world_of_one({"MASTER_ADDR": "10.0.0.1", "RANK": "0"}, 1)["MASTER_PORT"] == "1"
    assert "MASTER_ADDR" not in group.world_of_one({"MASTER_ADDR": "10.0.0.1"}, 1)


def test_only_knobs_that_differ_from_the_scripts_own_values_go_into_its_calls():
    settings = knobs.full_settings({"ddp_bucket_cap_mb": 100, "static_graph": True, "ddp_backend": "auto"})
    own = {"ddp_bucket_cap_mb": 25, "static_graph": True, "gradient_as_bucket_view": False, "ddp_backend": "gloo"}
    assert group.changed(settings, own, set(), tuple(group.DDP_ARGUMENTS)) == ["ddp_bucket_cap_mb"]
    assert group.changed(settings, own, {"ddp_bucket_cap_mb"}, tuple(group.DDP_ARGUMENTS)) == []  # its own flag
    assert group.changed(settings, own, set(), ("ddp_backend",)) == ["ddp_backend"]
    assert group.backend_for("auto", "cpu") == "gloo" and group.backend_for("auto", "cuda") == "nccl"


def test_the_baseline_is_the_scripts_own_backend_and_ddp_arguments():
    seen = {"process_group": {"backend_asked": "gloo"},
            "ddp": {"asked": {"bucket_cap_mb": 50, "gradient_as_bucket_view": True, "static_graph": False}}}
    assert group.baseline(seen) == {"ddp_backend": "gloo", "ddp_bucket_cap_mb": 50, "gradient_as_bucket_view": True,
                                    "static_graph": False}
    # a backend left to torch (None) or a script without DDP: the knobs' defaults stand
    assert group.baseline({"process_group": {"backend_asked": None}, "ddp": None}) == {}


def test_a_key_error_on_a_torchrun_variable_is_a_script_written_for_torchrun():
    assert group.reads_torchrun_env(KeyError("LOCAL_RANK"))
    assert not group.reads_torchrun_env(KeyError("DATA_DIR")) and not group.reads_torchrun_env(ValueError("RANK"))


def test_a_single_process_script_joining_a_group_gets_a_world_of_one_and_it_is_cleaned_up(no_torchrun_env):
    # GIVEN a script run as one process that calls init_process_group as under torchrun (env://)
    originals = (dist.init_process_group, DDP.__init__)
    hooks = installed()
    try:
        dist.init_process_group(backend="gloo")
        # THEN it joined a group of one, as `torchrun --nproc-per-node 1` would have given it
        assert dist.get_world_size() == 1 and os.environ["LOCAL_RANK"] == "0"
        model = DDP(nn.Linear(4, 2), bucket_cap_mb=50)
        # AND its DDP arguments are its own (the DDP knobs apply only to DDP probes)
        assert model.bucket_bytes_cap == 50 * 2**20
    finally:
        hooks.remove()
        hooks.group.close()
    facts = hooks.group.facts()
    assert facts["process_group"]["world_size"] == 1 and "MASTER_PORT" in facts["process_group"]["torchrun_env_set"]
    assert facts["ddp"]["asked"] == {"bucket_cap_mb": 50, "gradient_as_bucket_view": False, "static_graph": False}
    # AND the group the script left (stopped mid-loop) is gone, with the variables set for it
    assert not dist.is_initialized() and "LOCAL_RANK" not in os.environ
    assert (dist.init_process_group, DDP.__init__) == originals  # nothing patched is left


def test_a_script_that_reads_torchrun_variables_itself_gets_them_before_it_starts(no_torchrun_env):
    hooks = installed(up_front=True)
    try:
        assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"
    finally:
        hooks.remove()
        hooks.group.close()
    assert "RANK" not in os.environ and hooks.group.facts()["torchrun_env"] is True


def test_in_a_ddp_probe_the_knobs_go_into_the_wrapper_and_the_scripts_destroy_is_put_off(no_torchrun_env,
                                                                                         monkeypatch):
    # GIVEN a rank of a DDP probe (torchrun's variables set) whose settings change the bucket size and static_graph
    torchrun_env_of_one(monkeypatch)
    own = {"ddp_bucket_cap_mb": 25, "static_graph": False, "gradient_as_bucket_view": False, "ddp_backend": "gloo"}
    hooks = installed({"ddp_bucket_cap_mb": 5, "static_graph": True, "ddp_backend": "gloo"}, world_size=2,
                      baseline=own)
    try:
        dist.init_process_group(backend="gloo")
        model = DDP(nn.Linear(4, 2))
        # THEN the wrapper has the probe's DDP settings, read back from DDP itself
        assert hooks.group.ddp["applied"] == {"bucket_cap_bytes": 5 * 2**20, "static_graph": True,
                                              "gradient_as_bucket_view": False}
        assert model.static_graph
        # AND the script's destroy_process_group at its end leaves the group for the ranks' gather
        dist.destroy_process_group()
        assert dist.is_initialized() and hooks.group.destroy_put_off
    finally:
        hooks.remove()
    hooks.group.close()  # a DDP probe's group is distributed/rank.py finish's to destroy, not close's
    assert dist.is_initialized()
    dist.destroy_process_group()


class FakeRank:
    """driver.Steps's view of a torchrun rank: whether the script joined, and rank 0's decision at each step."""

    def __init__(self, decisions, joined=True):
        self.decisions, self._joined, self.world_size = list(decisions), joined, 2
        self.asked: list[bool] = []

    def joined(self):
        return self._joined

    def agree(self, stop):
        self.asked.append(stop)
        return self.decisions.pop(0)


class FakeHooks:
    def __init__(self):
        self.train_loader, self.applied, self.loss = None, {}, None
        self.fetch_wall_s = self.fetch_cpu_s = 0.0

    def take_step_input(self):
        return 0.001, 8.0, False, 1

    def read_loss(self):
        return 1.0


def steps_with(rank, protocol):
    out = {"raw": evidence.empty_raw(), "extra": {}}
    spec = ProbeSpec(id="p", workload="train.py", settings=knobs.full_settings(), protocol=protocol)
    steps = driver.Steps(spec, out, lambda text: None, "cpu", rank)
    steps.hooks = FakeHooks()
    return steps, out


def test_every_rank_ends_warm_up_and_stops_at_rank_0s_decision():
    # GIVEN a rank whose own stop rule would stop after 2 measured steps, and rank 0 that stops after 4
    protocol = Protocol(warmup_steps=1, min_steps=2, min_time_s=0.0, max_steps=2, max_time_s=60.0)
    rank = FakeRank([True, False, False, False, True])  # the warm-up's end, then four measured steps
    steps, out = steps_with(rank, protocol)
    with pytest.raises(ScriptStop) as stopped:
        for _ in range(10):
            steps(None)
    # THEN it asked at every step and followed rank 0: 4 measured steps, not its own 2
    assert stopped.value.kind == "done" and len(out["raw"]["step_s"]) == 4 and steps.steps == 5
    assert rank.asked == [True, False, True, True, True]


def test_a_rank_whose_script_never_joined_a_group_is_refused_saying_each_rank_trains_alone():
    steps, _ = steps_with(FakeRank([], joined=False), Protocol(warmup_steps=1))
    with pytest.raises(ScriptStop) as stopped:
        steps(None)
    assert stopped.value.kind == "refused" and "each of the 2 ranks would train alone" in stopped.value.message


def test_a_script_rank_writes_its_result_and_the_merged_one_over_the_scripts_group(no_torchrun_env, monkeypatch,
                                                                                 tmp_path):
    # GIVEN a script rank (world of one) whose script joined its group and wrapped its model
    torchrun_env_of_one(monkeypatch)
    monkeypatch.setattr(rank_mod, "_die_with_parent", lambda: None)  # the test process has no torchrun agent
    spec = ProbeSpec(id="p", workload="train.py", settings=knobs.full_settings(), distributed={"nproc_per_node": 2})
    rank = rank_mod.setup_script(spec)
    assert not rank.joined()  # nothing initialised by the tool
    dist.init_process_group(backend="gloo")
    assert rank.joined() and rank.agree(True) and not rank.agree(False)
    rank.wrapped({"bucket_cap_bytes": 1, "static_graph": False, "gradient_as_bucket_view": False})
    raw = {"step_s": [0.1, 0.2], "data_wait_s": [0.0, 0.0], "h2d_s": [0.0, 0.0], "items": [8.0, 8.0],
           "loss": [1.0, 0.9], "loss_step": [1, 2]}
    result = {"status": "ok", "error": None, "unit": "samples/s", "applied": {}, "gpu": None, "raw": raw,
              "extra": {}, "memory": {"child_maxrss_bytes": 10}}
    written = {}
    # WHEN it finishes
    assert rank_mod.finish(result, tmp_path / "r.json", lambda path, data: written.update({path.name: data})) == 0
    # THEN its rank file and the job's result are written, and the script's group is gone
    merged = written["r.json"]["extra"]["distributed"]
    assert merged["world_size"] == 1 and merged["backend"] == "gloo" and merged["ddp"]["bucket_cap_bytes"] == 1
    assert written["r.json.rank0"]["rank"]["rank"] == 0 and not dist.is_initialized()
    json.dumps(written["r.json"])  # the result file is JSON


def test_a_script_that_never_joins_a_group_is_refused_under_nproc_per_node(tmp_path):
    # GIVEN a plain single-process script whose probes would run under --nproc-per-node 2, inspected (one process)
    script = {"args": ["--epochs", "1"], "map": {}, "cwd": str(tmp_path), "world_size": 2}
    spec = ProbeSpec(id="inspect", workload=str(SCRIPTS / "tiny_script.py"), settings=knobs.full_settings(),
                     mode="inspect", script=script)
    found = driver.inspect(spec, lambda text: None)
    # THEN it cannot be measured so: each rank would train alone; and it says what to do
    assert found["status"] == "load_error"
    assert "never calls torch.distributed.init_process_group" in found["error"]["cause"]
    assert "each of the 2 ranks would train alone" in found["error"]["cause"]
    assert "analyse it without --nproc-per-node" in found["error"]["fix"]


def test_on_cuda_a_ddp_probes_backend_setting_goes_into_the_scripts_call_where_it_differs(monkeypatch):
    # GIVEN a CUDA rank of a script that asks for gloo, probed at ddp_backend=auto (NCCL on CUDA); torch's
    # init_process_group replaced by one that records its arguments (no GPU here)
    calls = []

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None):
        calls.append(backend)

    monkeypatch.setattr(dist, "get_backend", lambda group=None: calls[-1])
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    own = {"ddp_backend": "gloo"}
    hooks = group.GroupHooks(knobs.full_settings({"ddp_backend": "auto"}), "cuda", True, set(), 2, own)
    hooks._init(init_process_group)(backend="gloo")
    # THEN the script's group is NCCL, and what it asked for is kept as its own
    assert calls == ["nccl"] and hooks.group == {"backend_asked": "gloo", "backend": "nccl", "world_size": 2,
                                                 "torchrun_env_set": []}
    # AND at its own setting (the baseline) the call is left as the script wrote it
    same = group.GroupHooks(knobs.full_settings({"ddp_backend": "gloo"}), "cuda", True, set(), 2, own)
    same._init(init_process_group)(backend="gloo")
    assert calls[-1] == "gloo"


@pytest.mark.parametrize("backend, made", [("gloo", False), ("cpu:gloo,cuda:nccl", False), ("nccl", True)])
def test_a_script_ranks_own_collectives_go_over_gloo_made_beside_an_nccl_group_once(monkeypatch, backend, made):
    # an NCCL collective needs the rank's own GPU set as current, which a script may never have done
    new_groups = []
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(dist, "new_group", lambda backend=None: new_groups.append(backend) or "gloo-group")
    rank = rank_mod.ScriptRank.__new__(rank_mod.ScriptRank)
    rank._control = None
    first, second = rank.control(), rank.control()
    assert first is second and new_groups == (["gloo"] if made else [])
    assert (first == "gloo-group") is made
