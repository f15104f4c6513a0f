"""Each knob really takes effect inside the child: evidence recorded there during the first step."""

import dataclasses

import pytest

from tune_advisor import api
from tune_advisor.errors import UsageError

from ..conftest import FAST, WORKLOADS


def applied(path, tmp_path, **settings):
    _, result = api.probe(path, settings, device="cpu", protocol=FAST, workdir=tmp_path)
    assert result.ok, result.error
    return result.applied


def test_cnn_knobs_off_leave_the_model_alone(tmp_path):
    facts = applied(WORKLOADS / "tiny_cnn.py", tmp_path)
    assert facts["compute_dtypes"] == ["float32"]
    assert facts["conv_weights_channels_last"] == 0 and facts["input_channels_last"] is False
    assert facts["loader_workers"] == 0 and facts["child_processes"] == 0
    assert facts["block_forwards_per_step"] == 1 and "checkpointing" not in facts


def test_cnn_knobs_on_are_each_applied(tmp_path, native_bf16):
    # GIVEN a CPU that computes bf16 natively (the detection forced where this one only emulates it)
    facts = applied(WORKLOADS / "tiny_cnn.py", tmp_path, amp="bf16", channels_last=True, num_workers=2,
                    checkpointing=True)
    assert facts["compute_dtypes"] == ["bfloat16"]  # every conv and linear ran under bf16 autocast
    assert facts["conv_weights_channels_last"] == facts["conv_layers"] == 3
    assert facts["input_channels_last"] is True
    assert facts["loader_workers"] == 2 and facts["child_processes"] == 2
    # the repeated blocks are wrapped, and each block's forward runs again in backward (recomputation)
    assert facts["checkpointing"] == {"method": "torch.utils.checkpoint", "container": "1", "blocks": 2}
    assert facts["block_forwards_per_step"] == 2


def test_bf16_is_refused_before_any_probe_on_a_cpu_that_only_emulates_it(tmp_path, force_cpu):
    # GIVEN an AVX2-only CPU (bf16 matmuls 25-80x slower than float32 there)
    force_cpu("avx2-only")
    # WHEN a probe asks for bf16 autocast, THEN it is refused with the reason after the workload's inspection,
    # before any probe ran
    with pytest.raises(UsageError, match=r"amp=bf16: not applicable: this CPU only emulates bf16 \(no avx512_bf16"):
        api.probe(WORKLOADS / "tiny_cnn.py", {"amp": "bf16"}, device="cpu", protocol=FAST, workdir=tmp_path)
    assert [p.name for p in tmp_path.glob("*.result.json")] == ["inspect.result.json"]


def test_hugging_face_checkpointing_uses_the_models_own_switch(tmp_path):
    pytest.importorskip("transformers")
    off = applied(WORKLOADS / "tiny_hf.py", tmp_path / "off")
    on = applied(WORKLOADS / "tiny_hf.py", tmp_path / "on", checkpointing=True)
    assert off["hf_gradient_checkpointing"] is False and off["block_forwards_per_step"] == 1
    assert on["checkpointing"]["method"].startswith("hf ")
    assert on["hf_gradient_checkpointing"] is True and on["block_forwards_per_step"] == 2


def test_items_are_counted_by_count_items(tmp_path):
    _, result = api.probe(WORKLOADS / "tiny_hf.py", {}, device="cpu", protocol=FAST, workdir=tmp_path)
    assert result.unit == "tokens/s"
    assert set(result.items) == {4 * 16}  # batch 4 x 16 tokens


def test_loader_and_optimizer_knobs_are_applied(tmp_path):
    _, result = api.probe(WORKLOADS / "tiny_mlp.py", {"num_workers": 2, "persistent_workers": True,
                                                      "prefetch_factor": 4, "optimizer_impl": "fused"},
                          device="cpu", protocol=FAST, workdir=tmp_path)
    assert result.ok, result.error
    facts = result.applied
    assert facts["persistent_workers"] is True and facts["prefetch_factor"] == 4
    assert facts["optimizer"] == {"class": "AdamW", "foreach": False, "fused": True}
    # AND warm-up drains the deeper queue: 2 workers x 4 batches each
    assert result.extra["warmup_steps"] == 8


def test_matmul_precision_is_set_in_the_child(tmp_path):
    # `high` is not applicable on a CPU (no TF32), so the probe runs with it through the runner directly
    from tune_advisor import knobs
    from tune_advisor.probe.runner import run_probe
    from tune_advisor.probe.spec import ProbeSpec

    spec = ProbeSpec(id="p1", workload=str(WORKLOADS / "tiny_mlp.py"), device="cpu", protocol=FAST,
                     settings=knobs.full_settings({"batch_size": 16, "matmul_precision": "high"}))
    result = run_probe(spec, tmp_path)
    assert result.ok, result.error
    assert result.applied["matmul_precision"] == "high"


def test_compile_time_is_measured_apart_from_the_timed_steps(tmp_path):
    _, result = api.probe(WORKLOADS / "tiny_mlp.py", {"compile": "default"}, device="cpu", protocol=FAST,
                          workdir=tmp_path)
    assert result.ok, result.error
    stats = result.extra["compile"]
    assert stats["mode"] == "default" and stats["graphs"] >= 1
    # the first (compiling) step is far slower than the steady ones, and none of them is among the timed steps
    steady = sorted(result.step_s)[len(result.step_s) // 2]
    assert stats["first_step_s"] > 10 * steady and stats["compile_s"] > 0.5 * stats["first_step_s"]
    assert max(result.step_s) < stats["first_step_s"]
    assert stats["recompiles_measured"] == 0
    assert result.applied["compute_dtypes"] is None  # no hooks inside a compiled model


def test_varying_input_shapes_make_compile_recompile(tmp_path):
    # A recompile inside the measured steps can take seconds on a busy machine: the time cap must not end the
    # measurement after one step, before a second shape shows.
    protocol = dataclasses.replace(FAST, min_steps=8, max_time_s=120.0)
    _, result = api.probe(WORKLOADS / "tiny_varlen.py", {"compile": "default"}, device="cpu", protocol=protocol,
                          workdir=tmp_path)
    assert result.ok, result.error
    stats = result.extra["compile"]
    assert stats["recompiles_warmup"] + stats["recompiles_measured"] >= 1
    assert result.extra["distinct_input_shapes"] > 1


def test_a_compile_failure_is_a_probe_error_with_its_cause(tmp_path, monkeypatch):
    # GIVEN a C++ compiler that does not exist (the zygote restarts with this environment)
    from tune_advisor import knobs
    from tune_advisor.probe.runner import run_probe
    from tune_advisor.probe.spec import ProbeSpec

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    spec = ProbeSpec(id="p1", workload=str(WORKLOADS / "tiny_mlp.py"), device="cpu", protocol=FAST,
                     settings=knobs.full_settings({"batch_size": 16, "compile": "default"}))
    # WHEN the probe compiles
    result = run_probe(spec, tmp_path)
    # THEN it is an error naming torch.compile, not a crash of the analysis
    assert result.status.value == "error"
    assert result.error.startswith("torch.compile failed:"), result.error


def test_knobs_that_cannot_apply_here_are_refused_before_any_probe(tmp_path, monkeypatch):
    from tune_advisor.errors import UsageError

    with pytest.raises(UsageError, match="prefetch_factor=4: not applicable: num_workers=0"):
        api.probe(WORKLOADS / "tiny_mlp.py", {"prefetch_factor": 4}, device="cpu", protocol=FAST, workdir=tmp_path)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    with pytest.raises(UsageError, match="compile=default: not applicable: torch.compile needs a C"):
        api.probe(WORKLOADS / "tiny_mlp.py", {"compile": "default"}, device="cpu", protocol=FAST,
                  workdir=tmp_path)


def test_a_setting_the_file_already_has_is_not_refused_as_a_change(tmp_path):
    # GIVEN a workload whose own baseline pins memory (as a Hugging Face Trainer does by default) on a CPU
    from tune_advisor.errors import UsageError

    pinned = tmp_path / "pinned.py"
    pinned.write_text((WORKLOADS / "tiny_mlp.py").read_text().replace(
        'BASELINE = {"batch_size": 16}', 'BASELINE = {"batch_size": 16, "pin_memory": True}'))
    # WHEN its full settings are passed back, as a re-measure of a report's baseline does
    _, result = api.probe(pinned, {"batch_size": 16, "pin_memory": True}, device="cpu", protocol=FAST,
                          workdir=tmp_path / "w")
    # THEN it runs: only a change can be not applicable
    assert result.ok, result.error
    with pytest.raises(UsageError, match="pin_memory=True: not applicable"):
        api.probe(WORKLOADS / "tiny_mlp.py", {"pin_memory": True}, device="cpu", protocol=FAST,
                  workdir=tmp_path / "w2")
