"""The profiler summary: a synthetic CUDA trace with known times, the trace file and its cap, a real CPU profile."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tune_advisor.collectors import designate, profiler

HOST, DEVICE = 100, 0
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def X(name, cat, ts, dur, pid=HOST, tid=1, **args):
    event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        event["args"] = args
    return event


def cuda_step(t0, copy="Pageable", copy_bytes=4096, extra_sync=False):
    """One 1000 us step (times in us from t0), laid out so each category's share is known:
    data loading 0-100, H2D copy 150-250 on the device, a kernel 300-600, loss.item() syncing 620-870,
    a memset 880-890, torch.cuda.synchronize() 900-950, Python idle 950-1000."""
    events = [
        X(f"ProfilerStep#{t0 // 1000 + 2}", "user_annotation", t0, 1000),
        X(LOADER, "user_annotation", t0, 100),
        X("aten::stack", "cpu_op", t0 + 10, 50),
        X("aten::to", "cpu_op", t0 + 100, 100),
        X("cudaMemcpyAsync", "cuda_runtime", t0 + 120, 60),
        X(f"Memcpy HtoD ({copy} -> Device)", "gpu_memcpy", t0 + 150, 100, pid=DEVICE, tid=7, bytes=copy_bytes),
        X("aten::addmm", "cpu_op", t0 + 200, 200),
        X("cudaLaunchKernel", "cuda_runtime", t0 + 250, 20),
        X("ampere_sgemm_128x64_tn", "kernel", t0 + 300, 300, pid=DEVICE, tid=7),
        X("aten::item", "cpu_op", t0 + 600, 300),
        X("aten::_local_scalar_dense", "cpu_op", t0 + 610, 280),
        X("cudaStreamSynchronize", "cuda_runtime", t0 + 620, 250),
        X("Memset (Device)", "gpu_memset", t0 + 880, 10, pid=DEVICE, tid=7),
        X("cudaDeviceSynchronize", "cuda_runtime", t0 + 900, 50),
    ]
    if extra_sync:  # a user's .item() in the idle tail
        events.append(X("cudaStreamSynchronize", "cuda_runtime", t0 + 960, 20))
    return events


def cuda_trace():
    meta = [{"ph": "M", "name": "process_name", "pid": HOST, "tid": 0, "args": {"name": "python"}}]
    return {"traceEvents": meta + cuda_step(0) + cuda_step(1000, copy="Pinned", copy_bytes=2048, extra_sync=True)}


def test_cuda_trace_breakdown_gives_each_instant_to_one_category():
    s = profiler.summarise_trace(cuda_trace(), "cuda")
    us = {k: round(v * 1e6, 6) for k, v in s["breakdown_s"].items()}
    # kernel first; the copy outside it; runtime calls not hidden by device work (30+20+250+50, +20 in step 2);
    # the loader; host ops in the gaps (20+30 around the launch, 20+10+10 around the sync); the idle tail
    assert us == {"kernel": 300, "memcpy": 100, "memset": 10, "runtime": 360, "data_loading": 100,
                  "cpu_exec": 90, "other": 40}
    assert s["steps"] == 2 and s["step_time_s"] == pytest.approx(1e-3)
    assert sum(s["breakdown_s"].values()) == pytest.approx(s["step_time_s"])
    assert sum(s["breakdown_frac"].values()) == pytest.approx(1.0)
    assert s["device_idle_frac"] == pytest.approx(1 - 410 / 1000)
    assert s["kernels_per_step"] == 1 and s["kernel_mean_s"] == pytest.approx(300e-6)
    assert s["top_kernels"][0]["name"] == "ampere_sgemm_128x64_tn"
    assert s["h2d_pageable_bytes"] == 2048 and s["h2d_pinned_bytes"] == 1024  # per step: 4096 and 2048 over 2
    assert s["sync_calls_per_step"] == {"aten::_local_scalar_dense": 1, "aten::item": 1,
                                        "cudaDeviceSynchronize": 1, "cudaStreamSynchronize": 1.5}
    assert s["device_syncs_per_step"] == 2.5 and s["user_device_syncs_per_step"] == 0.5
    assert s["ops_per_step"] == 4  # stack, to, addmm, item: _local_scalar_dense is nested in item
    assert s["dense_frac"] == pytest.approx(300 / 900)  # the GEMM kernel, of the step outside data loading


def test_device_work_running_past_the_host_step_extends_the_step():
    events = [X("ProfilerStep#2", "user_annotation", 0, 100), X("aten::mm", "cpu_op", 0, 50),
              X("sgemm", "kernel", 40, 200, pid=DEVICE, tid=7)]
    s = profiler.summarise_trace({"traceEvents": events}, "cuda")
    assert s["step_time_s"] == pytest.approx(240e-6)
    assert s["breakdown_s"]["kernel"] == pytest.approx(200e-6) and s["breakdown_s"]["cpu_exec"] == pytest.approx(40e-6)


def test_cpu_trace_has_no_device_figures():
    events = [X("ProfilerStep#2", "user_annotation", 0, 100), X("aten::mm", "cpu_op", 10, 60)]
    s = profiler.summarise_trace({"traceEvents": events}, "cpu")
    assert s["breakdown_s"]["cpu_exec"] == pytest.approx(60e-6) and s["breakdown_s"]["other"] == pytest.approx(40e-6)
    assert s["device_idle_frac"] is None and s["kernels_per_step"] is None and s["h2d_pageable_bytes"] is None
    assert s["device_syncs_per_step"] is None


def test_dense_share_counts_matmuls_and_convolutions_outside_data_loading_once():
    # GIVEN a 1000 us CPU step: the loader 0-400 (an augmentation's convolution inside it), then a convolution
    # (the wrapper and its kernel op nested), a linear layer and an activation
    events = [X("ProfilerStep#2", "user_annotation", 0, 1000), X(LOADER, "user_annotation", 0, 400),
              X("aten::mkldnn_convolution", "cpu_op", 50, 300),
              X("aten::convolution", "cpu_op", 500, 200), X("aten::mkldnn_convolution", "cpu_op", 510, 180),
              X("aten::addmm", "cpu_op", 700, 100), X("aten::relu", "cpu_op", 800, 100)]
    s = profiler.summarise_trace({"traceEvents": events}, "cpu")
    # THEN 300 us of the 600 us outside the loader are dense: the nested op is not counted twice, the
    # augmentation's convolution not at all
    assert s["dense_frac"] == pytest.approx(0.5)
    # a step that is all data loading has no compute to share out
    only_loading = [X("ProfilerStep#2", "user_annotation", 0, 100), X(LOADER, "user_annotation", 0, 100)]
    assert profiler.summarise_trace({"traceEvents": only_loading}, "cpu")["dense_frac"] is None


def test_the_optimizer_share_is_its_annotations_time_outside_data_loading():
    # GIVEN two 1000 us CPU steps, each loading for 200 us and stepping the optimizer for 200 us (zero_grad beside it,
    # and a third step's optimizer call outside the profiled steps)
    events = []
    for t0 in (0, 1000):
        events += [X(f"ProfilerStep#{t0 // 1000 + 2}", "user_annotation", t0, 1000),
                   X(LOADER, "user_annotation", t0, 200),
                   X("Optimizer.step#AdamW.step", "user_annotation", t0 + 700, 200),
                   X("aten::add_", "cpu_op", t0 + 710, 150),
                   X("Optimizer.zero_grad#AdamW.zero_grad", "user_annotation", t0 + 900, 50)]
    events.append(X("Optimizer.step#AdamW.step", "user_annotation", 2500, 400))
    s = profiler.summarise_trace({"traceEvents": events}, "cpu")
    # THEN: 200 of the 800 us of compute
    assert s["optimizer_frac"] == pytest.approx(0.25)


def test_on_cuda_the_optimizer_share_counts_the_kernels_its_step_launched_where_they_take_longer():
    # GIVEN a step whose optimizer launches for 100 us on the host, its kernel (matched by correlation id) running
    # 400 us on the device; another kernel, launched outside it, runs beside
    def step(kernel_us):
        return [X("ProfilerStep#2", "user_annotation", 0, 1000),
                X("Optimizer.step#AdamW.step", "user_annotation", 100, 100),
                X("cudaLaunchKernel", "cuda_runtime", 120, 10, correlation=7),
                X("multi_tensor_apply_kernel", "kernel", 150, kernel_us, pid=DEVICE, tid=7, correlation=7),
                X("cudaLaunchKernel", "cuda_runtime", 20, 10, correlation=3),
                X("ampere_sgemm_128x64_tn", "kernel", 40, 100, pid=DEVICE, tid=7, correlation=3)]

    # THEN the device's 400 us of the 1000 us step; where the kernel is shorter than the launches, the host's 100
    assert profiler.summarise_trace({"traceEvents": step(400)}, "cuda")["optimizer_frac"] == pytest.approx(0.4)
    assert profiler.summarise_trace({"traceEvents": step(50)}, "cuda")["optimizer_frac"] == pytest.approx(0.1)


def test_a_trace_without_step_markers_is_an_error():
    with pytest.raises(RuntimeError, match="ProfilerStep"):
        profiler.summarise_trace({"traceEvents": [X("aten::mm", "cpu_op", 0, 1)]})


def test_trace_file_is_gzipped_json_and_capped(tmp_path):
    trace = cuda_trace()
    path = tmp_path / "p001.trace.json.gz"
    record = profiler.write_trace(trace, path)
    assert record == {"file": "p001.trace.json.gz", "bytes": path.stat().st_size, "truncated": False, "note": None}
    assert json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] == trace["traceEvents"]

    # GIVEN a cap between one step's size and two steps' size: only the first step is kept, with a note
    one = len(gzip.compress(json.dumps(profiler.first_step_only(trace)).encode()))
    two = path.stat().st_size
    assert one < two
    record = profiler.write_trace(trace, path, max_bytes=(one + two) // 2, steps=2)
    kept = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert record["truncated"] and "kept only the first profiled step" in record["note"]
    assert [e["name"] for e in kept if e["name"].startswith("ProfilerStep")] == ["ProfilerStep#2"]
    assert any(e["ph"] == "M" for e in kept)

    # GIVEN a cap below even one step: nothing is written, and the note says so
    path.unlink()
    record = profiler.write_trace(trace, path, max_bytes=10)
    assert record["file"] is None and "not kept" in record["note"] and not path.exists()


def test_top_operators_leave_out_annotations():
    avg = [SimpleNamespace(key="ProfilerStep*", count=3, self_cpu_time_total=900, self_device_time_total=0),
           SimpleNamespace(key=LOADER, count=3, self_cpu_time_total=800, self_device_time_total=0,
                           is_user_annotation=True),
           SimpleNamespace(key="aten::addmm", count=6, self_cpu_time_total=600, self_device_time_total=3000),
           SimpleNamespace(key="aten::relu", count=3, self_cpu_time_total=300, self_device_time_total=0)]
    top = profiler.top_operators(avg, steps=3)
    assert [o["name"] for o in top["top_ops_host"]] == ["aten::addmm", "aten::relu"]
    assert top["top_ops_host"][0] == {"name": "aten::addmm", "calls_per_step": 2,
                                      "self_s_per_step": pytest.approx(200e-6)}
    assert [o["name"] for o in top["top_ops_device"]] == ["aten::addmm"]
    assert top["top_ops_device"][0]["self_s_per_step"] == pytest.approx(1e-3)


def test_real_cpu_profile_of_a_linear_and_conv_model(tmp_path):
    # GIVEN a Conv2d + Linear model trained for the profiler's five steps, in this process
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,))

    def step(i):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    path = tmp_path / "p001.trace.json.gz"
    summary = profiler.profile_steps(step, "cpu", path)
    # THEN its operators show up, the breakdown fits in the step, and the trace is a Perfetto-readable file
    names = {o["name"] for o in summary["top_ops_host"]}
    assert names & {"aten::addmm", "aten::mm"}
    assert names & {"aten::convolution", "aten::_convolution", "aten::mkldnn_convolution",
                    "aten::convolution_backward", "aten::thnn_conv2d"}
    assert summary["steps"] == 3 and summary["schedule"] == {"wait": 1, "warmup": 1, "active": 3}
    assert sum(summary["breakdown_s"].values()) <= summary["step_time_s"] * (1 + 1e-9)
    assert summary["breakdown_s"]["cpu_exec"] > 0 and summary["breakdown_s"]["kernel"] == 0
    assert 0 < summary["dense_frac"] < 1  # the conv and linear layers' ops, not the optimizer or the loss
    assert 0 < summary["optimizer_frac"] < 1  # torch.optim annotates each opt.step()
    assert summary["trace"]["file"] == path.name
    assert json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert not list(tmp_path.glob("*.raw.json"))  # the uncompressed export is removed
    json.dumps(summary, allow_nan=False)


def test_profile_policy_designates_the_first_baseline_and_recommended_probe():
    wants = designate.ProfilePolicy()
    roles = ["baseline", "knob:amp", "baseline", "confirm:baseline", "confirm:recommended", "confirm:recommended"]
    assert [wants(r) for r in roles] == [True, False, False, False, True, False]
    assert not designate.ProfilePolicy(enabled=False)("baseline")
    probes = [{"settings": {"amp": "off"}, "extra": {}}, {"id": "p2", "settings": {"amp": "off"},
                                                           "extra": {"profile": {"steps": 3}}}]
    assert designate.profiled_probe(probes, {"amp": "off"})["id"] == "p2"
    assert designate.profiled_probe(probes, {"amp": "bf16"}) is None


def test_without_a_trace_path_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = torch.randn(4, 4, requires_grad=True)
    summary = profiler.profile_steps(lambda i: (x @ x).sum().backward(), "cpu", None)
    assert summary["trace"]["file"] is None and summary["steps"] == 3
    assert not list(tmp_path.iterdir())


def test_a_short_budget_profiles_fewer_steps_and_a_long_one_the_full_schedule():
    full = {"wait": profiler.WAIT, "warmup": profiler.WARMUP, "active": profiler.ACTIVE}
    # GIVEN no budget, or one whose share holds the five steps: the full schedule
    assert profiler.schedule_within(1.8, None) == full
    assert profiler.schedule_within(1.8, 600.0) == full  # 5% of 10 minutes: 30 s, sixteen steps
    # GIVEN a 1-minute run's baseline with 1.8 s steps: no settling step, the profiler's warm-up and one recorded
    assert profiler.schedule_within(1.8, 57.0) == {"wait": 0, "warmup": 1, "active": 1}
    # AND with 0.7 s steps three fit: the warm-up and two recorded
    assert profiler.schedule_within(0.7, 45.0) == {"wait": 0, "warmup": 1, "active": 2}
    # AND a step without a time (none measured) keeps the full schedule
    assert profiler.schedule_within(0.0, 10.0) == full
    # THEN a one-step schedule profiles that step and counts per step over it
    x = torch.randn(4, 4, requires_grad=True)
    summary = profiler.profile_steps(lambda i: (x @ x).sum().backward(), "cpu", None,
                                     **profiler.schedule_within(1.8, 57.0))
    assert summary["steps"] == 1


def test_the_baseline_window_is_a_tenth_of_a_short_budget_and_the_protocols_cap_beyond():
    from tune_advisor.planner.budget import BASELINE_SHARE, SCREEN_MAX_S, probe_limits
    from tune_advisor.probe.spec import Protocol

    protocol = Protocol()  # its own cap: 15 s
    # GIVEN a 1-minute run's baseline (about 57 s left): a tenth of it
    assert probe_limits("baseline", 57.0).protocol(protocol).max_time_s == pytest.approx(BASELINE_SHARE * 57.0)
    # AND a 10-minute one: the protocol's own cap
    assert probe_limits("baseline", 597.0).protocol(protocol).max_time_s == protocol.max_time_s
    # AND never below a screening probe's window; the runs alone keep the protocol's own
    assert probe_limits("baseline", 12.0).protocol(protocol).max_time_s == SCREEN_MAX_S
    assert probe_limits("confirm:alone:baseline", 57.0).protocol(protocol).max_time_s == protocol.max_time_s


def test_a_confirmation_rounds_sides_measure_a_duels_window_in_lockstep_too():
    from tune_advisor.planner.budget import probe_limits
    from tune_advisor.planner.confirm import CONFIRM_TURN_WINDOW_S, ROUND_ROLES
    from tune_advisor.probe.spec import Protocol

    # GIVEN the default protocol (15 s cap) and a minute's confirmation with 26 s left (a 1-minute
    # varlen_transformer run's first round, in timed turns, measured 13 s a side there and ran out of budget)
    protocol = Protocol()
    # THEN each side of a round measures at most CONFIRM_TURN_WINDOW_S, however it is paired
    for role in ROUND_ROLES:
        assert probe_limits(role, 26.0).protocol(protocol).max_time_s == CONFIRM_TURN_WINDOW_S
