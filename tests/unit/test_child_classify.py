"""How the probe child names a failure: out of memory, the workload's own error, or no kernel on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tune_advisor.probe.child import classify
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
