"""The CUDA-only behaviour, on a real GPU. Skipped only when torch sees no CUDA device."""

import pytest
import torch

from tune_advisor import api
from tune_advisor.probe.result import Status

from ..conftest import FAST, WORKLOADS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def probe(path, tmp_path, **settings):
    _, result = api.probe(path, settings, device="cuda", protocol=FAST, workdir=tmp_path)
    return result


def test_pin_memory_pins_host_batches_and_the_host_does_not_wait_for_their_copies(tmp_path):
    # 4 MiB batches: an H200 read overlap 0.0 both ways on tiny_mlp's kilobyte ones (launching took the host as
    # long as the copy took the device)
    pinned = probe(WORKLOADS / "wide_input.py", tmp_path, pin_memory=True, num_workers=1)
    assert pinned.ok, pinned.error
    assert pinned.applied["batch_pinned"] is True
    # timed on the GPU (no synchronize per step), the copy ran while the host went on: non_blocking took effect
    h2d = pinned.extra["h2d"]
    assert h2d["clock"] == "cuda events" and h2d["non_blocking"] is True and h2d["device_copy_s"] > 0
    pageable = probe(WORKLOADS / "wide_input.py", tmp_path, pin_memory=False, num_workers=1)
    assert pageable.extra["h2d"]["non_blocking"] is False
    assert h2d["overlap_frac"] > pageable.extra["h2d"]["overlap_frac"]


def test_nvml_samples_come_from_the_probed_gpu(tmp_path):
    result = probe(WORKLOADS / "tiny_cnn.py", tmp_path)
    gpu = result.gpu
    assert gpu is not None and gpu["samples"] > 0
    # matched by the UUID CUDA reports for the probe's device, not by an index NVML may number differently
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    assert gpu["device_matched_by"].startswith("uuid ") and gpu["device_matched_by"].endswith(uuid)


def test_fp16_runs_with_a_grad_scaler_and_trains(tmp_path):
    result = probe(WORKLOADS / "tiny_cnn.py", tmp_path, amp="fp16")
    assert result.ok, result.error
    assert result.applied["compute_dtypes"] == ["float16"] and result.applied["grad_scaler"] is True
    losses = [x for x in result.raw["loss"] if x is not None]
    assert len(losses) == len(result.step_s) > 0  # every scaled step kept a finite loss


def test_bf16_autocast_on_cuda(tmp_path):
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    result = probe(WORKLOADS / "tiny_cnn.py", tmp_path, amp="bf16")
    assert result.ok and result.applied["compute_dtypes"] == ["bfloat16"]
    assert result.applied["grad_scaler"] is False


def test_cudnn_benchmark_is_set_in_the_child_and_its_first_step_autotunes(tmp_path):
    result = probe(WORKLOADS / "tiny_cnn.py", tmp_path, cudnn_benchmark=True)
    assert result.ok and result.applied["cudnn_benchmark"] is True
    # the first step tries the convolution algorithms: slower than a steady one
    assert result.extra["warmup_step_s"][0] > sorted(result.step_s)[len(result.step_s) // 2]


def test_a_lockstep_pair_leaves_room_for_two_cuda_contexts():
    from tune_advisor.collectors import cuda_memory
    from tune_advisor.executors.local import pair_memory

    context, how = cuda_memory.context_bytes("cuda")
    assert context and context > 50 * 2**20, how  # a context is hundreds of MiB
    total = torch.cuda.get_device_properties(0).total_memory
    assert pair_memory("cuda", None) <= int(0.9 * total) - 2 * context + 64 * 2**20  # measured twice: drift


def test_peak_memory_is_the_cuda_allocator_peak(tmp_path):
    result = probe(WORKLOADS / "tiny_cnn.py", tmp_path)
    assert result.peak_memory_bytes == result.memory["cuda_max_allocated_bytes"] > 0


def test_cuda_out_of_memory_is_oom(tmp_path):
    result = probe(WORKLOADS / "cuda_oom.py", tmp_path, batch_size=64)
    assert result.status is Status.OOM and "out of memory" in result.error.lower()


def test_cuda_knobs_are_probed_not_skipped(tmp_path):
    # only the CUDA knobs, so the analysis ends in about a minute rather than at its budget
    options = api.AnalyzeOptions(out=tmp_path / "out", device="cuda", protocol=FAST, budget="3m", profile=False,
                                 only_knobs=("pin_memory", "cudnn_benchmark"))
    result = api.analyze(WORKLOADS / "tiny_cnn.py", options)
    tried = [p for p in result.probes if p.settings["pin_memory"] or p.settings["cudnn_benchmark"]]
    assert tried and all(p.status is not Status.SKIPPED for p in tried)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_each_ddp_rank_samples_its_own_gpu(tmp_path):
    _, result = api.probe(WORKLOADS / "tiny_ddp.py", {}, device="cuda", protocol=FAST, workdir=tmp_path,
                          nproc_per_node=2)
    assert result.ok, result.error
    ranks = result.extra["distributed"]["ranks"]
    matched = [r["gpu"]["device_matched_by"] for r in ranks]
    assert len(set(matched)) == 2 and all(m.startswith("uuid ") for m in matched)
