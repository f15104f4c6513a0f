import pytest

from tune_advisor import knobs
from tune_advisor.knobs import DeviceFacts, WorkloadFacts

CPU = DeviceFacts("cpu")
CUDA = DeviceFacts("cuda", "Fake GPU", bf16_supported=False)
MLP = WorkloadFacts(model_class="MLP")
CNN = WorkloadFacts(model_class="CNN", conv_layers=3, repeated_blocks="blocks: 2 x Block")


@pytest.mark.parametrize("name, raw, expected", [
    ("batch_size", "64", 64), ("batch_size", 8, 8), ("num_workers", "0", 0),
    ("pin_memory", "true", True), ("pin_memory", "off", False), ("channels_last", True, True),
    ("amp", "bf16", "bf16"),
])
def test_parse_accepts_cli_strings_and_python_values(name, raw, expected):
    assert knobs.KNOBS[name].parse(raw) == expected


@pytest.mark.parametrize("name, raw", [
    ("batch_size", 0), ("batch_size", "-4"), ("batch_size", True), ("batch_size", 2.5), ("num_workers", -1),
    ("amp", "fp8"), ("pin_memory", "maybe"), ("amp", None),
])
def test_parse_rejects_invalid_values_and_lists_the_valid_ones(name, raw):
    with pytest.raises(ValueError, match="valid: "):
        knobs.KNOBS[name].parse(raw)


def test_unknown_knob_suggests_the_close_name():
    with pytest.raises(ValueError, match=r"unknown knob 'batchsize' \(did you mean 'batch_size'\?\)"):
        knobs.validate_settings({"batchsize": 32})


def test_search_must_be_lists_of_valid_values():
    assert knobs.validate_search({"amp": ["off", "bf16"], "batch_size": [8, "16"]}) == {
        "amp": ["off", "bf16"], "batch_size": [8, 16]}
    with pytest.raises(ValueError, match=r"\['amp'\].*'fp8'"):
        knobs.validate_search({"amp": ["off", "fp8"]})
    with pytest.raises(ValueError, match="must be a list"):
        knobs.validate_search({"amp": "bf16"})
    with pytest.raises(ValueError, match="empty"):
        knobs.validate_search({"batch_size": []})


def test_full_settings_fills_every_knob_with_defaults():
    settings = knobs.full_settings({"batch_size": 4})
    assert set(settings) == set(knobs.KNOBS) and settings["batch_size"] == 4 and settings["amp"] == "off"


@pytest.mark.parametrize("name, value, workload, device, reason", [
    ("pin_memory", True, MLP, CPU, "no CUDA device"),
    ("cudnn_benchmark", True, CNN, CPU, "no CUDA device"),
    ("amp", "fp16", MLP, CPU, "needs a CUDA device"),
    ("amp", "bf16", MLP, CUDA, "no bf16 support"),
    # a CPU that only emulates bf16 runs it many times slower than float32: not probed (tests/unit/test_native_types)
    ("amp", "bf16", MLP, DeviceFacts("cpu", bf16_supported=False), "no native bf16"),
    ("amp", "bf16", MLP, DeviceFacts("cpu", bf16_supported=False, bf16_reason="this CPU only emulates bf16"),
     "not applicable: this CPU only emulates bf16"),
    ("channels_last", True, MLP, CPU, "no convolution layers"),
    ("checkpointing", True, MLP, CPU, "no repeated blocks to checkpoint"),
    ("compile", "reduce-overhead", MLP, CPU, "CUDA graphs, which need a CUDA device"),
    ("compile", "default", MLP, DeviceFacts("cpu", compile_unavailable="no C++ compiler"), "no C++ compiler"),
    ("matmul_precision", "high", MLP, CPU, "TF32 is a CUDA feature"),
    ("matmul_precision", "medium", MLP, DeviceFacts("cpu", bf16_supported=False), "no native bf16"),
    ("matmul_precision", "medium", MLP, DeviceFacts("cpu", bf16_supported=False, bf16_reason="no bf16 here"),
     "medium computes float32 matmuls in bf16, and no bf16 here"),
    ("matmul_precision", "high", MLP, CUDA, "compute capability 8.0"),
    ("optimizer_impl", "fused", WorkloadFacts(optimizer_class="RMSprop", optimizer_impls=("foreach",)), CPU,
     "RMSprop cannot be built with fused=True"),
])
def test_not_applicable_says_why(name, value, workload, device, reason):
    assert reason in knobs.not_applicable(name, value, workload, device)


@pytest.mark.parametrize("name, value, workload, device", [
    ("amp", "bf16", MLP, CPU), ("channels_last", True, CNN, CPU), ("checkpointing", True, CNN, CPU),
    ("pin_memory", True, MLP, CUDA), ("amp", "fp16", MLP, CUDA), ("pin_memory", False, MLP, CPU),
    ("checkpointing", True, WorkloadFacts(hf_checkpointing=True), CPU),
    ("compile", "default", MLP, CPU), ("compile", "max-autotune", MLP, CPU),
    ("compile", "reduce-overhead", MLP, DeviceFacts("cuda", "Fake GPU")),
    ("matmul_precision", "high", MLP, DeviceFacts("cuda", "Fake Ampere", tf32=True)),
    ("matmul_precision", "medium", MLP, CPU),
    ("optimizer_impl", "fused", WorkloadFacts(optimizer_impls=("foreach", "fused")), CPU),
    ("persistent_workers", True, MLP, CPU), ("prefetch_factor", 4, MLP, CPU),
])
def test_applicable_knobs_give_no_reason(name, value, workload, device):
    assert knobs.not_applicable(name, value, workload, device) is None


def test_describe_shows_only_differences_from_a_base():
    base = knobs.full_settings()
    # in catalogue order
    assert knobs.describe({**base, "amp": "bf16", "pin_memory": True}, base) == "pin_memory=true, amp=bf16"
    assert knobs.describe(base, base) == "(baseline)"


@pytest.mark.parametrize("name, value", [("persistent_workers", True), ("prefetch_factor", 4)])
def test_loader_worker_knobs_need_workers_in_the_same_settings(name, value):
    without = knobs.full_settings({"num_workers": 0})
    assert "num_workers=0" in knobs.not_applicable(name, value, MLP, CPU, without)
    assert knobs.not_applicable(name, value, MLP, CPU, {**without, "num_workers": 2}) is None


@pytest.mark.parametrize("name, raw, expected", [
    ("compile", "max-autotune", "max-autotune"), ("matmul_precision", "high", "high"),
    ("persistent_workers", "yes", True), ("prefetch_factor", "8", 8), ("optimizer_impl", "fused", "fused"),
])
def test_new_knobs_parse(name, raw, expected):
    assert knobs.KNOBS[name].parse(raw) == expected


@pytest.mark.parametrize("name, raw", [("compile", "inductor"), ("matmul_precision", "low"),
                                       ("prefetch_factor", 0), ("optimizer_impl", "apex")])
def test_new_knobs_reject_invalid_values(name, raw):
    with pytest.raises(ValueError, match="valid: "):
        knobs.KNOBS[name].parse(raw)
