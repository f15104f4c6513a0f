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


def test_pin_memory_pins_host_batches(tmp_path):
    result = probe(WORKLOADS / "tiny_mlp.py", tmp_path, pin_memory=True, num_workers=1)
    assert result.ok, result.error
    assert result.applied["batch_pinned"] is True


def test_fp16_runs_with_a_grad_scaler(tmp_path):
    result = probe(WORKLOADS / "tiny_cnn.py", tmp_path, amp="fp16")
    assert result.ok, result.error
    assert result.applied["compute_dtypes"] == ["float16"] and result.applied["grad_scaler"] is True


def test_bf16_autocast_on_cuda(tmp_path):
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    result = probe(WORKLOADS / "tiny_cnn.py", tmp_path, amp="bf16")
    assert result.ok and result.applied["compute_dtypes"] == ["bfloat16"]
    assert result.applied["grad_scaler"] is False


def test_cudnn_benchmark_is_set_in_the_child(tmp_path):
    result = probe(WORKLOADS / "tiny_cnn.py", tmp_path, cudnn_benchmark=True)
    assert result.ok and result.applied["cudnn_benchmark"] is True


def test_peak_memory_is_the_cuda_allocator_peak(tmp_path):
    result = probe(WORKLOADS / "tiny_cnn.py", tmp_path)
    assert result.peak_memory_bytes == result.memory["cuda_max_allocated_bytes"] > 0


def test_cuda_out_of_memory_is_oom(tmp_path):
    result = probe(WORKLOADS / "cuda_oom.py", tmp_path, batch_size=64)
    assert result.status is Status.OOM and "out of memory" in result.error.lower()


def test_cuda_knobs_are_probed_not_skipped(tmp_path):
    result = api.analyze(WORKLOADS / "tiny_cnn.py", api.AnalyzeOptions(out=tmp_path / "out", device="cuda",
                                                                       protocol=FAST, budget="5m"))
    tried = [p for p in result.probes if p.settings["pin_memory"] or p.settings["cudnn_benchmark"]]
    assert tried and all(p.status is not Status.SKIPPED for p in tried)
