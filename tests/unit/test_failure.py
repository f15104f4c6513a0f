"""How the probe child names a failure: out of memory, the workload's own error, or no kernel on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tune_advisor.probe.failure import classify
from tune_advisor.probe.result import Status

ONEDNN_LSTM = ("could not create a primitive descriptor for the LSTM forward propagation primitive. Run workload "
               "with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.")


class Tagger(torch.nn.Module):
    """Raises `message` from inside its forward, as a layer without a kernel would."""

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def forward(self, x):
        raise RuntimeError(self.message)


def raised(message: str) -> BaseException:
    try:
        Tagger(message)(torch.zeros(1))
    except RuntimeError as exc:
        return exc
    raise AssertionError("did not raise")


@pytest.mark.parametrize("message, settings, op", [
    (ONEDNN_LSTM, {"amp": "bf16"}, "LSTM"),
    ("\"addmm_impl_cpu_\" not implemented for 'BFloat16'", {"amp": "bf16"}, "addmm_impl_cpu_"),
    ("\"slow_conv2d_cpu\" not implemented for 'Half'", {"amp": "fp16", "channels_last": True}, "slow_conv2d_cpu"),
])
def test_a_missing_kernel_under_a_dtype_knob_is_unsupported_naming_operator_layer_and_knob(message, settings, op):
    status, cause = classify(raised(message), Path("tagger.py"), {"amp": "off", **settings})
    assert status is Status.UNSUPPORTED
    assert cause.startswith(f"{op} (in Tagger) has no kernel here for ")
    assert all(f"{k}={str(v).lower() if isinstance(v, bool) else v}" in cause for k, v in settings.items())


def test_the_same_message_with_every_dtype_knob_off_is_the_workloads_own_error():
    status, cause = classify(raised(ONEDNN_LSTM), Path("tagger.py"), {"amp": "off", "channels_last": False})
    assert status is Status.ERROR and "primitive descriptor" in cause


def test_other_failures_keep_their_status_under_a_dtype_knob():
    oom = raised("DefaultCPUAllocator: can't allocate memory")
    assert classify(oom, Path("t.py"), {"amp": "bf16"})[0] is Status.OOM
    assert classify(raised("shapes cannot be multiplied"), Path("t.py"), {"amp": "bf16"})[0] is Status.ERROR


@pytest.mark.parametrize("message", [
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; 77.1 GiB already allocated)",
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
    "NCCL version 2.21.5\\nncclUnhandledCudaError: Call to CUDA function failed.\\nLast error:\\nCuda failure 2 "
    "'out of memory'",
    "CUDA driver error: CUDA_ERROR_OUT_OF_MEMORY",
])
def test_every_way_a_gpu_says_it_is_out_of_memory_is_oom(message):
    # (the batch-size ladder then records a memory frontier and bisects it, as for any oom)
    assert classify(raised(message), Path("t.py"), {"amp": "fp16"}, memory_used=lambda: 0.2)[0] is Status.OOM


def test_cudnn_not_supported_is_oom_only_when_the_device_was_nearly_full():
    message = "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input."
    status, cause = classify(raised(message), Path("t.py"), {"amp": "fp16"}, memory_used=lambda: 0.97)
    assert status is Status.OOM and "97% of the device's memory in use: no workspace fitted" in cause
    assert classify(raised(message), Path("t.py"), {}, memory_used=lambda: 0.30)[0] is Status.ERROR
    assert classify(raised(message), Path("t.py"), {}, memory_used=lambda: None)[0] is Status.ERROR
