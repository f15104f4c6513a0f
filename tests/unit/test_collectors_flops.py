"""FLOPs per step against hand counts; the peak cache; MFU arithmetic."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from torch import nn

from tune_advisor.collectors import flops


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def train_step_flops(model, x, y) -> int:
    def step():
        nn.functional.cross_entropy(model(x), y).backward()

    return flops.count_flops(step)


def test_linear_layers_match_the_hand_count():
    # GIVEN Linear(in, hidden) -> ReLU -> Linear(hidden, out) on a batch of B
    B, i, h, o = 8, 32, 64, 10
    model = nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o))
    counted = train_step_flops(model, torch.randn(B, i), torch.randint(0, o, (B,)))
    # THEN forward is 2*B*in*out per layer; backward is twice that (input and weight gradients), except for the
    # first layer, whose input needs no gradient
    first, second = 2 * B * i * h, 2 * B * h * o
    assert counted == (first + first) + (second + 2 * second)


def test_conv_then_linear_match_the_hand_count():
    # GIVEN the collector tests' workload: Conv2d(3, 8, 3, padding=1) on 8x8 images, then Linear(8*8*8, 10)
    B, cin, cout, k, hw, classes = 16, 3, 8, 3, 8, 10
    model = nn.Sequential(nn.Conv2d(cin, cout, k, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(cout * hw * hw, classes))
    counted = train_step_flops(model, torch.randn(B, cin, hw, hw), torch.randint(0, classes, (B,)))
    conv = 2 * B * cout * hw * hw * cin * k * k  # a multiply-add per output element and filter tap
    linear = 2 * B * cout * hw * hw * classes
    assert counted == (conv + conv) + (linear + 2 * linear) == 1_376_256


def test_compute_dtype_follows_amp():
    assert flops.compute_dtype("bf16", "cpu") == "bf16"
    assert flops.compute_dtype("off", "cpu") == "fp32"
    assert flops.compute_dtype("fp16", "cuda") == "fp16"


def test_mfu_is_achieved_over_the_peak_of_the_probes_dtype():
    peaks = {"fp32": 2e11, "bf16": 1.4e12}
    f = flops.summarise(per_step=1e9, step_median_s=0.01, peaks=peaks, dtype="bf16")
    assert f["achieved_flops_per_s"] == pytest.approx(1e11)
    assert f["peak_flops_per_s"] == 1.4e12 and f["peak_dtype"] == "bf16"
    assert f["mfu"] == pytest.approx(1e11 / 1.4e12)
    assert f["peaks"] == peaks
    none = flops.summarise(per_step=1e9, step_median_s=0.01, peaks=None, dtype="fp32")
    assert none["mfu"] is None and none["peak_flops_per_s"] is None and none["achieved_flops_per_s"] > 0


def test_the_cache_lives_under_xdg_cache_home(tmp_path, monkeypatch):
    assert flops.cache_path() == tmp_path / "cache" / "tune-advisor" / "peaks.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert flops.cache_path() == tmp_path / "home" / ".cache" / "tune-advisor" / "peaks.json"


def test_peaks_are_cached_per_machine_key():
    key = flops.peak_key("cpu")
    assert flops.cached_peaks("cpu", key) is None
    flops.store_peaks(key, "cpu", {"fp32": 1e11, "bf16": 7e11}, "test")
    flops.store_peaks("another-machine/cpu", "cpu", {"fp32": 5e10}, "test")
    assert flops.cached_peaks("cpu") == {"fp32": 1e11, "bf16": 7e11}
    doc = json.loads(flops.cache_path().read_text())
    assert doc["schema"] == flops.CACHE_SCHEMA and set(doc["peaks"]) == {key, "another-machine/cpu"}
    assert f"threads={torch.get_num_threads()}" in key  # the CPU roof depends on the intra-op threads


def test_a_corrupt_cache_is_ignored_and_rewritten():
    flops.cache_path().parent.mkdir(parents=True)
    flops.cache_path().write_text("{not json")
    assert flops.cached_peaks("cpu") is None
    flops.store_peaks("k", "cpu", {"fp32": 1.0}, "test")
    assert flops.cached_peaks("cpu", "k") == {"fp32": 1.0}


def test_measure_peaks_times_a_matmul_per_dtype():
    peaks = flops.measure_peaks("cpu", size=64, min_time_s=0)
    assert set(peaks) == {"fp32", "bf16"} and all(v > 0 for v in peaks.values())


def test_ensure_peaks_uses_the_cache_and_never_raises(monkeypatch):
    flops.store_peaks(flops.peak_key("cpu"), "cpu", {"fp32": 3e11}, "test")
    assert flops.ensure_peaks("cpu") == ({"fp32": 3e11}, f"ok: cached in {flops.cache_path()}")

    # GIVEN a fresh cache and a measuring process that dies: a status line, no exception
    flops.cache_path().unlink()

    def dies(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, "", "Traceback ...\nRuntimeError: boom")

    monkeypatch.setattr(flops.subprocess, "run", dies)
    peaks, status = flops.ensure_peaks("cpu")
    assert peaks is None and status == "error: measuring the peak failed (RuntimeError: boom)"


def test_flops_by_op_separate_convolutions_from_matmuls():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    x, y = torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,))
    by_op = flops.count_flops_by_op(lambda: nn.functional.cross_entropy(model(x), y).backward())
    conv, linear = 2 * 16 * 8 * 64 * 27, 2 * 16 * 512 * 10
    assert by_op["aten.convolution"] == conv and by_op["aten.convolution_backward"] == conv
    assert by_op["aten.addmm"] == linear and by_op["aten.mm"] == 2 * linear
    assert flops.conv_share(by_op) == pytest.approx(2 * conv / (2 * conv + 3 * linear))
    assert flops.conv_share({}) == 0.0


@pytest.mark.parametrize("matmul_tf32, cudnn_tf32, conv_frac, expected", [
    (False, True, 0.0, "fp32"),   # a transformer at PyTorch's defaults: matmuls in full fp32
    (False, True, 0.9, "tf32"),   # a CNN at the defaults: cuDNN runs its convolutions as TF32
    (True, True, 0.0, "tf32"),    # set_float32_matmul_precision("high")
    (True, False, 0.9, "fp32"),
])
def test_fp32_on_ampere_is_measured_against_the_tf32_roof_when_most_flops_run_as_tf32(
        monkeypatch, matmul_tf32, cudnn_tf32, conv_frac, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    # torch.backends.cuda.matmul reads its switch from torch._C on every access
    monkeypatch.setattr(torch._C, "_get_cublas_allow_tf32", lambda: matmul_tf32)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", cudnn_tf32)
    assert flops.compute_dtype("off", "cuda", conv_frac) == expected
    assert flops.compute_dtype("bf16", "cuda", conv_frac) == "bf16"
