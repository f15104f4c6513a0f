"""One verdict on which types the device computes natively, from injected CPU flags and CUDA properties: what
knob applicability, the peak calibration and `tune-advisor env` read."""

from __future__ import annotations

import pytest

from tune_advisor import api, environment, hardware, knobs
from tune_advisor.cli import env as env_cli
from tune_advisor.collectors import flops
from tune_advisor.knobs import DeviceFacts, WorkloadFacts

from ..fakes import (AMPERE_A100, AMX_CPUINFO, AVX512_BF16_CPUINFO, GRAVITON2_CPUINFO, GRAVITON3_CPUINFO,
                     TURING_T4, UNKNOWN_CPUINFO, ZEN3_CPUINFO)

MLP = WorkloadFacts(model_class="MLP")
EMULATED = "this CPU only emulates bf16 (no avx512_bf16/amx_bf16): bf16 matmuls run many times slower than float32"


def facts(device_type: str, native: hardware.NativeTypes, tf32: bool = False) -> DeviceFacts:
    """DeviceFacts as api.device_facts builds them from the verdict."""
    return DeviceFacts(device_type, "Fake", native.bf16.native, native.bf16.reason, tf32=tf32)


@pytest.mark.parametrize("cpu_info, native, reason", [
    (ZEN3_CPUINFO, False, EMULATED),
    (AVX512_BF16_CPUINFO, True, "this CPU computes bf16 natively (avx512_bf16)"),
    (AMX_CPUINFO, True, "this CPU computes bf16 natively (amx_bf16)"),
    (GRAVITON3_CPUINFO, True, "this Arm CPU computes bf16 natively (bf16 in its Features)"),
    (GRAVITON2_CPUINFO, False, "this Arm CPU only emulates bf16 (no bf16 in its Features)"),
    (UNKNOWN_CPUINFO, False, "cannot tell whether this CPU runs bf16 natively"),
])
def test_cpu_bf16_is_native_only_with_bf16_instructions(cpu_info, native, reason):
    verdict = hardware.native_types("cpu", cpu_info=cpu_info).bf16
    assert verdict.native is native and reason in verdict.reason


def test_cpu_fp16_needs_its_own_instructions():
    assert not hardware.native_types("cpu", cpu_info=AVX512_BF16_CPUINFO).fp16.native  # bf16 alone is not fp16
    assert hardware.native_types("cpu", cpu_info=GRAVITON2_CPUINFO).fp16.native  # asimdhp
    assert "cannot tell" in hardware.native_types("cpu", cpu_info=UNKNOWN_CPUINFO).fp16.reason


def test_an_unreadable_cpuinfo_reads_as_an_unknown_platform(tmp_path):
    assert hardware.read_cpuinfo(str(tmp_path / "absent")) == ""
    assert not hardware.cpu_native_types("processor\t: 0\nvendor_id\t: Unknown\n").bf16.native


@pytest.mark.parametrize("props, bf16", [(TURING_T4, False), (AMPERE_A100, True)])
def test_cuda_bf16_needs_compute_capability_8_and_fp16_is_always_native(props, bf16):
    native = hardware.native_types("cuda", cuda_props=props)
    assert native.bf16.native is bf16 and native.fp16.native
    assert f"compute capability {props.major}.{props.minor}" in native.bf16.reason


def test_the_verdict_serialises_for_results_json():
    assert hardware.native_types("cpu", cpu_info=ZEN3_CPUINFO).to_dict() == {
        "bf16": {"native": False, "reason": EMULATED},
        "fp16": {"native": False, "reason": "this CPU only emulates fp16 (no avx512_fp16/amx_fp16): fp16 matmuls "
                                            "run many times slower than float32"}}


# --- what the verdict decides -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cpu_info, applies", [
    (ZEN3_CPUINFO, False), (AVX512_BF16_CPUINFO, True), (AMX_CPUINFO, True), (GRAVITON3_CPUINFO, True),
    (GRAVITON2_CPUINFO, False), (UNKNOWN_CPUINFO, False),
])
def test_bf16_knobs_apply_on_a_cpu_only_where_bf16_is_native(cpu_info, applies):
    native = hardware.native_types("cpu", cpu_info=cpu_info)
    device = facts("cpu", native)
    amp = knobs.not_applicable("amp", "bf16", MLP, device)
    medium = knobs.not_applicable("matmul_precision", "medium", MLP, device)
    if applies:
        assert amp is None and medium is None
    else:
        assert amp == f"not applicable: {native.bf16.reason}"
        assert medium == f"not applicable: medium computes float32 matmuls in bf16, and {native.bf16.reason}"
    assert "needs a CUDA device" in knobs.not_applicable("amp", "fp16", MLP, device)  # fp16 autocast: CUDA only


def test_a_zen3_cpu_lists_bf16_as_not_applicable_with_the_reason():
    device = facts("cpu", hardware.native_types("cpu", cpu_info=ZEN3_CPUINFO))
    assert knobs.not_applicable("amp", "bf16", MLP, device) == f"not applicable: {EMULATED}"


@pytest.mark.parametrize("props, bf16_applies", [(TURING_T4, False), (AMPERE_A100, True)])
def test_cuda_without_native_bf16_falls_back_to_fp16(props, bf16_applies):
    device = facts("cuda", hardware.native_types("cuda", cuda_props=props), tf32=props.major >= 8)
    bf16 = knobs.not_applicable("amp", "bf16", MLP, device)
    assert (bf16 is None) is bf16_applies
    if not bf16_applies:
        assert "Tesla T4 (compute capability 7.5) has no native bf16" in bf16 and "fp16 with a GradScaler" in bf16
    assert knobs.not_applicable("amp", "fp16", MLP, device) is None


@pytest.mark.parametrize("cpu_info, measured, skipped", [
    (ZEN3_CPUINFO, ["fp32"], {"bf16": f"skipped: {EMULATED}"}),
    (AVX512_BF16_CPUINFO, ["fp32", "bf16"], {}),
    (AMX_CPUINFO, ["fp32", "bf16"], {}),
    (GRAVITON3_CPUINFO, ["fp32", "bf16"], {}),
    (GRAVITON2_CPUINFO, ["fp32"], {"bf16": "skipped: " + hardware.native_types(
        "cpu", cpu_info=GRAVITON2_CPUINFO).bf16.reason}),
    (UNKNOWN_CPUINFO, ["fp32"], {"bf16": "skipped: cannot tell whether this CPU runs bf16 natively (no CPU flags "
                                         "in /proc/cpuinfo)"}),
])
def test_the_calibration_measures_only_native_dtypes_on_a_cpu(cpu_info, measured, skipped):
    assert flops.peak_dtypes("cpu", hardware.native_types("cpu", cpu_info=cpu_info)) == (measured, skipped)


def test_the_calibration_measures_only_native_dtypes_on_a_gpu():
    t4 = hardware.native_types("cuda", cuda_props=TURING_T4)
    measured, skipped = flops.peak_dtypes("cuda", t4, capability=(7, 5))
    assert measured == ["fp32", "fp16"] and list(skipped) == ["bf16"]
    a100 = hardware.native_types("cuda", cuda_props=AMPERE_A100)
    assert flops.peak_dtypes("cuda", a100, capability=(8, 0)) == (["fp32", "bf16", "fp16", "tf32"], {})


# --- the real entry points read /proc/cpuinfo through hardware.read_cpuinfo --------------------------------------


@pytest.fixture
def zen3(monkeypatch):
    monkeypatch.setattr(hardware, "read_cpuinfo", lambda path=hardware.CPUINFO: ZEN3_CPUINFO)


def test_device_facts_carry_the_verdict(zen3):
    device = api.device_facts("cpu")
    assert device.bf16_supported is False and device.bf16_reason == EMULATED
    assert knobs.not_applicable("amp", "bf16", MLP, device) == f"not applicable: {EMULATED}"


def test_environment_records_and_env_shows_the_verdict(zen3, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert environment.collect("cpu")["native_types"]["bf16"] == {"native": False, "reason": EMULATED}
    shown = dict(env_cli.rows(env_cli.gather("cpu")))
    assert shown["native types"].startswith(f"bf16 no: {EMULATED}; fp16 no: ")
