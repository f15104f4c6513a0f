"""The collectors inside real probe children on the CPU: profile, FLOPs and MFU, NVML absent, never in the timing."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time

import pytest

from tune_advisor import api
from tune_advisor.collectors import flops, memory
from tune_advisor.probe.spec import Protocol

from ..conftest import WORKLOADS

LINEAR_CONV = WORKLOADS / "linear_conv.py"
# Exactly three measured steps, however fast or noisy: the profiler's five steps must not add to them.
THREE_STEPS = Protocol(warmup_steps=1, min_steps=3, min_time_s=0.0, max_steps=3, max_time_s=10.0)
# Hand count for linear_conv.py at batch 16 (see tests/unit/test_collectors_flops.py).
HAND_FLOPS = 1_376_256
PEAKS = {"fp32": 2e11, "bf16": 1.4e12}  # pretend roofs: the test checks the arithmetic, not this machine


@pytest.fixture
def cached_peaks(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the child inherits it
    flops.store_peaks(flops.peak_key("cpu"), "cpu", PEAKS, "test")


def test_profiled_probe_summarises_a_known_op_mix(tmp_path, cached_peaks):
    # GIVEN a Conv2d + Linear workload probed with the profiler on
    _, result = api.probe(LINEAR_CONV, {}, device="cpu", protocol=THREE_STEPS, workdir=tmp_path, profile=True)
    assert result.ok, result.error
    extra = result.extra
    assert extra["collectors"] == {"nvml": "absent: the probe runs on the CPU", "flops": "ok", "profiler": "ok"}
    assert result.gpu is None

    # THEN the profiled steps stayed out of the timing
    assert len(result.step_s) == len(result.raw["loss"]) == len(result.items) == 3

    # AND the top operators are the model's matmul and convolution
    profile = extra["profile"]
    names = {op["name"] for op in profile["top_ops_host"]}
    assert names & {"aten::addmm", "aten::mm"}
    assert names & {"aten::convolution", "aten::_convolution", "aten::mkldnn_convolution",
                    "aten::convolution_backward"}
    # AND the breakdown fits in the step, with the CPU work in "cpu_exec" and the loader in "data_loading"
    assert profile["steps"] == 3
    assert sum(profile["breakdown_s"].values()) <= profile["step_time_s"] * (1 + 1e-9)
    assert profile["breakdown_s"]["cpu_exec"] > 0 and profile["breakdown_s"]["data_loading"] > 0
    assert profile["device_idle_frac"] is None and profile["h2d_pageable_bytes"] is None
    assert profile["sync_calls_per_step"].get("aten::item", 0) >= 1  # the probe's own loss.item()

    # AND the trace sits next to the result, gzipped JSON that Perfetto opens
    trace_path = tmp_path / profile["trace"]["file"]
    assert trace_path.name == "probe.trace.json.gz"
    assert json.loads(gzip.decompress(trace_path.read_bytes()))["traceEvents"]

    # AND FLOPs per step match the hand count; MFU is achieved over the fp32 roof
    f = extra["flops"]
    assert f["per_step"] == HAND_FLOPS and f["peak_dtype"] == "fp32" and f["peak_flops_per_s"] == PEAKS["fp32"]
    step_median = sorted(result.step_s)[1]
    assert f["achieved_flops_per_s"] == pytest.approx(HAND_FLOPS / step_median)
    assert f["mfu"] == pytest.approx(f["achieved_flops_per_s"] / PEAKS["fp32"])
    json.dumps(result.to_dict(), allow_nan=False)


def test_unprofiled_bf16_probe_measures_against_the_bf16_roof_and_leaves_no_trace(tmp_path, native_bf16,
                                                                                  cached_peaks):
    # GIVEN a CPU that computes bf16 natively (the detection forced where this one only emulates it; forced before
    # the peaks are cached, since the cache is keyed by the machine the detection reads)
    _, result = api.probe(LINEAR_CONV, {"amp": "bf16"}, device="cpu", protocol=THREE_STEPS, workdir=tmp_path)
    assert result.ok, result.error
    assert result.extra["collectors"]["profiler"] == "skipped: not a designated probe"
    assert "profile" not in result.extra and not list(tmp_path.glob("*.trace.json.gz"))
    f = result.extra["flops"]
    assert f["peak_dtype"] == "bf16" and f["peak_flops_per_s"] == PEAKS["bf16"] and f["per_step"] == HAND_FLOPS


def test_without_measured_peaks_mfu_is_null_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    _, result = api.probe(LINEAR_CONV, {}, device="cpu", protocol=THREE_STEPS, workdir=tmp_path)
    assert result.ok, result.error
    assert result.extra["flops"]["mfu"] is None and result.extra["flops"]["per_step"] == HAND_FLOPS
    assert result.extra["collectors"]["flops"].startswith("partial: no measured fp32 peak")


def test_cli_probe_profile_prints_the_summary(cli, tmp_path, cached_peaks):
    result = cli("probe", LINEAR_CONV, "--profile", "--workdir", tmp_path, "--min-steps", "3", "--min-time", "0",
                 "--warmup", "1")
    assert result.exit_code == 0, result.output
    assert "of the measured fp32 peak" in result.output and "top host ops" in result.output
    assert (tmp_path / "probe.trace.json.gz").exists()


def test_the_loading_threads_cpu_share_tells_a_cpu_bound_loader_from_one_waiting_on_storage(tmp_path, cached_peaks):
    # GIVEN in-memory samples built by Python and collated (CPU work) and samples that each wait 3 ms for "storage"
    _, busy = api.probe(LINEAR_CONV, {}, device="cpu", protocol=THREE_STEPS, workdir=tmp_path / "busy")
    _, waiting = api.probe(WORKLOADS / "tiny_io.py", {}, device="cpu", protocol=THREE_STEPS,
                           workdir=tmp_path / "waiting")
    assert busy.ok and waiting.ok, (busy.error, waiting.error)
    # THEN the planner's worker cap reads the first as CPU-bound and the second as mostly asleep: a sleeping fetch
    # holds little of its wall time on a CPU whatever the machine does; a computing one most of it on an idle
    # machine (0.9 and more), less where other processes want the CPUs too (it waits for one), still several times
    # the sleeping one's
    assert waiting.extra["fetch_cpu_frac"] < 0.2
    assert busy.extra["fetch_cpu_frac"] > max(0.25, 3 * waiting.extra["fetch_cpu_frac"])
    # AND with loader workers the main thread only waits: nothing to read
    _, workers = api.probe(WORKLOADS / "tiny_io.py", {"num_workers": 2}, device="cpu", protocol=THREE_STEPS,
                           workdir=tmp_path / "workers")
    assert workers.ok, workers.error
    assert workers.extra["fetch_cpu_frac"] is None


# A root that fills 100 MB, forks three children that only read it, and says when they are all running.
FORK_TREE = """
import os, sys, time
block = b"\\x01" * (100 * 2**20)
pids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        time.sleep(1.5)
        os._exit(0 if block[-1] == 1 else 1)
    pids.append(pid)
print("ready", flush=True)
sys.exit(max(os.waitpid(pid, 0)[1] for pid in pids))
"""


@pytest.mark.skipif(not memory._HAS_PROC_CHILDREN, reason="Linux /proc children lists")
def test_forked_children_sharing_the_roots_pages_count_them_once():
    # GIVEN a process holding 100 MB and three forked children sharing it copy-on-write, sampled from here
    root = subprocess.Popen([sys.executable, "-c", FORK_TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout.readline().strip() == "ready"
        sampler = memory.TreeMemorySampler(root.pid, interval_s=0.1)
        sampler.start()
        time.sleep(0.8)
        sampler.stop()
        assert root.wait(timeout=10) == 0
    finally:
        root.kill()
        root.wait()

    # THEN the shared pages count once: about the 100 MB, where the summed RSS counts them four times
    assert sampler.peak_counts == memory.SHARED_ONCE, sampler.smaps_unreadable
    assert sampler.peak_bytes >= 100 * 2**20
    assert sampler.peak_bytes < 0.6 * sampler.rss_sum_peak_bytes
    assert sampler.rss_sum_peak_bytes >= 400 * 2**20
    # AND the children's smaps_rollup was read once, not on every tick
    assert sampler.smaps_refreshes == 1 and sampler.samples >= 4


def test_a_probe_records_both_tree_peaks_and_how_the_first_was_counted(tmp_path):
    _, result = api.probe(WORKLOADS / "tiny_io.py", {"num_workers": 2}, device="cpu", protocol=THREE_STEPS,
                          workdir=tmp_path)
    assert result.ok, result.error
    m = result.memory
    assert m["tree_peak_counts"] in (memory.ONE_PROCESS, memory.SHARED_ONCE)
    assert 0 < m["sampled_tree_peak_bytes"] <= m["sampled_tree_rss_sum_peak_bytes"]
    assert result.peak_memory_bytes == max(m["sampled_tree_peak_bytes"], m["child_maxrss_bytes"])
