"""FLOPs per step against hand counts; the peak cache; MFU arithmetic."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import torch
from torch import nn

from tune_advisor import hardware
from tune_advisor.collectors import flops

from ..fakes import AVX512_BF16_CPUINFO, ZEN3_CPUINFO


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
    assert f["mfu"] == pytest.approx(1e11 / 1.4e12) and f["mfu_unavailable"] is None
    assert f["peaks"] == peaks
    none = flops.summarise(per_step=1e9, step_median_s=0.01, peaks=None, dtype="fp32")
    assert none["mfu"] is None and none["peak_flops_per_s"] is None and none["achieved_flops_per_s"] > 0
    assert none["mfu_unavailable"].startswith("no measured fp32 peak for this machine")


def test_mfu_without_a_roof_says_why():
    # GIVEN a machine whose bf16 roof was skipped (not native) and whose cache says so
    gaps = {"bf16": "skipped: this CPU only emulates bf16 (no avx512_bf16/amx_bf16)"}
    f = flops.summarise(per_step=1e9, step_median_s=0.01, peaks={"fp32": 2e11}, dtype="bf16", gaps=gaps)
    assert f["mfu"] is None
    assert f["mfu_unavailable"] == "bf16 peak skipped: this CPU only emulates bf16 (no avx512_bf16/amx_bf16)"


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
    peaks = flops.measure_peaks("cpu", size=64, min_time_s=0, dtypes=(["fp32", "bf16"], {}))
    assert set(peaks) == {"fp32", "bf16"} and all(v > 0 for v in peaks.values())


def sleeping_timer(flops_per_s: dict[str, float]):
    """A matmul of each dtype at a fixed rate: it sleeps as long as the real one would take."""
    def make(device, dtype):
        def run(n):
            seconds = 2 * n**3 / flops_per_s[dtype]
            time.sleep(seconds)
            return seconds
        return run
    return make


def test_an_emulated_dtype_ends_small_within_its_bound():
    # GIVEN bf16 emulated on an AVX2-only CPU: 1.4 GFLOP/s, where a 2048 matmul takes 12 s
    started = time.perf_counter()
    cal = flops.calibrate("cpu", per_dtype_s=1.0, dtypes=(["bf16"], {}), timer=sleeping_timer({"bf16": 1.4e9}))
    took = time.perf_counter() - started
    # THEN it ends within its second, at a small size, with the rate it measured
    assert took < 1.0 + 0.25, took  # at most about one more matmul than the bound
    assert cal.sizes["bf16"] <= 512 and cal.peaks["bf16"] == pytest.approx(1.4e9, rel=0.05)
    assert cal.gaps == {}


def test_a_fast_dtype_grows_while_it_gains_and_stops_at_the_plateau():
    largest = flops.MAX_SIZE["cpu"]
    # a many-core machine: the rate keeps doubling with the size, up to the largest
    climbing = flops.calibrate("cpu", min_time_s=0, dtypes=(["fp32"], {}),
                               timer=lambda device, dtype: lambda n: 2 * n**3 / (1e14 * n / largest))
    assert climbing.sizes["fp32"] == largest and climbing.peaks["fp32"] == pytest.approx(1e14)
    # a machine already at its plateau at the second size: growing further would only spend time
    flat = flops.calibrate("cpu", min_time_s=0, dtypes=(["fp32"], {}),
                           timer=lambda device, dtype: lambda n: 2 * n**3 / (2e11 if n > 256 else 1.5e11))
    assert flat.sizes["fp32"] == 512 and flat.peaks["fp32"] == pytest.approx(2e11)


def test_the_overall_time_is_shared_between_dtypes_and_what_does_not_fit_is_recorded():
    timer = sleeping_timer({"fp32": 3e9, "bf16": 1.4e9})
    started = time.perf_counter()
    cal = flops.calibrate("cpu", 1.5, dtypes=(["fp32", "bf16"], {}), timer=timer)
    assert time.perf_counter() - started < 1.5 and set(cal.peaks) == {"fp32", "bf16"}
    # with no time at all, nothing is measured and each dtype says why
    none = flops.calibrate("cpu", 0.1, dtypes=(["fp32", "bf16"], {"fp16": "skipped: not native"}), timer=timer)
    assert none.peaks == {} and none.gaps["fp16"] == "skipped: not native"
    assert none.gaps["fp32"].startswith(flops.OUT_OF_TIME) and none.gaps["bf16"].startswith(flops.OUT_OF_TIME)


def test_a_dtype_that_fails_leaves_the_others():
    def timer(device, dtype):
        if dtype == "bf16":
            raise RuntimeError("no bf16 kernel")
        return lambda n: 2 * n**3 / 1e11

    cal = flops.calibrate("cpu", min_time_s=0, dtypes=(["fp32", "bf16"], {}), timer=timer)
    assert set(cal.peaks) == {"fp32"} and cal.gaps == {"bf16": "not measured: RuntimeError: no bf16 kernel"}


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


@pytest.fixture
def zen3(monkeypatch):
    monkeypatch.setattr(hardware, "read_cpuinfo", lambda path=hardware.CPUINFO: ZEN3_CPUINFO)


@pytest.fixture
def bf16_cpu(monkeypatch):
    monkeypatch.setattr(hardware, "read_cpuinfo", lambda path=hardware.CPUINFO: AVX512_BF16_CPUINFO)


def counting_run(monkeypatch, outcome):
    """Replace the calibration child: `outcome(argv)` runs instead; returns the list of argvs it was called with."""
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return outcome(argv, kwargs)

    monkeypatch.setattr(flops.subprocess, "run", run)
    return calls


def test_a_calibration_that_times_out_is_recorded_and_not_rerun(zen3, monkeypatch):
    def stalls(argv, kwargs):
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    calls = counting_run(monkeypatch, stalls)
    # WHEN the calibration runs past its time
    peaks, status = flops.ensure_peaks("cpu", timeout_s=15)
    assert peaks is None and status == "error: measuring the peak took over 15 s"
    assert len(calls) == 1 and "--deadline" in calls[0]
    # THEN the cache records why each dtype has no roof
    assert flops.peak_gaps("cpu") == {
        "fp32": "not measured: measuring the peak took over 15 s",
        "bf16": "skipped: this CPU only emulates bf16 (no avx512_bf16/amx_bf16): bf16 matmuls run many times "
                "slower than float32"}
    # AND the next run with the same time does not wait for it again
    peaks, status = flops.ensure_peaks("cpu", timeout_s=15)
    assert peaks is None and len(calls) == 1
    assert status.startswith("error: measuring the peak took over 15 s (recorded in ")
    # while a run given twice the time, or asked to retry (`env --measure-peaks`), tries again
    flops.ensure_peaks("cpu", timeout_s=30)
    flops.ensure_peaks("cpu", timeout_s=30)
    flops.ensure_peaks("cpu", timeout_s=30, retry=True)
    assert len(calls) == 3


def test_a_calibration_that_crashed_is_recorded_and_rerun_only_on_request(zen3, monkeypatch):
    calls = counting_run(monkeypatch, lambda argv, kwargs: subprocess.CompletedProcess(argv, 1, "", "MemoryError"))
    assert flops.ensure_peaks("cpu") == (None, "error: measuring the peak failed (MemoryError)")
    assert flops.ensure_peaks("cpu", timeout_s=600)[0] is None and len(calls) == 1
    flops.ensure_peaks("cpu", retry=True)
    assert len(calls) == 2


def test_what_a_stopped_calibration_measured_is_kept(bf16_cpu, monkeypatch):
    # GIVEN a child that cached its fp32 roof and was stopped while measuring bf16
    def stopped_in_bf16(argv, kwargs):
        key = argv[argv.index("--key") + 1]
        flops.store_peaks(key, "cpu", {"fp32": 2e11}, "test", sizes={"fp32": 2048})
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    counting_run(monkeypatch, stopped_in_bf16)
    peaks, status = flops.ensure_peaks("cpu", timeout_s=4)
    assert peaks == {"fp32": 2e11}
    assert status.endswith("(bf16 not measured: measuring the peak took over 4 s)")
    assert flops.peak_gaps("cpu") == {"bf16": "not measured: measuring the peak took over 4 s"}
    entry = flops.cached_entry("cpu")
    assert entry["incomplete"] and entry["timed_out"] and entry["time_limit_s"] == 4


def test_the_child_caches_skipped_dtypes_and_the_parent_then_reads_them(zen3, monkeypatch, capsys):
    # GIVEN the calibration child on a CPU without native bf16 (a fast fake matmul in place of torch's)
    monkeypatch.setattr(flops, "torch_timer", lambda device, dtype: lambda n: 2 * n**3 / 1e11)
    assert flops.main(["cpu", "--deadline", str(time.time() + 10)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed["flops_per_s"]) == {"fp32"} and printed["gaps"]["bf16"].startswith("skipped: ")
    # THEN ensure_peaks answers from the cache, naming the skipped roof, and never starts a child
    calls = counting_run(monkeypatch, lambda argv, kwargs: pytest.fail("the calibration ran again"))
    peaks, status = flops.ensure_peaks("cpu")
    assert peaks == {"fp32": pytest.approx(1e11)} and not calls
    assert status.startswith(f"ok: cached in {flops.cache_path()} (bf16 skipped: this CPU only emulates bf16")
    assert not flops.cached_entry("cpu")["incomplete"]


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
