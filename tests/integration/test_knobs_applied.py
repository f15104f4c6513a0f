"""Each knob really takes effect inside the child: evidence recorded there during the first step."""

import pytest

from tune_advisor import api

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


def test_cnn_knobs_on_are_each_applied(tmp_path):
    facts = applied(WORKLOADS / "tiny_cnn.py", tmp_path, amp="bf16", channels_last=True, num_workers=2,
                    checkpointing=True)
    assert facts["compute_dtypes"] == ["bfloat16"]  # every conv and linear ran under bf16 autocast
    assert facts["conv_weights_channels_last"] == facts["conv_layers"] == 3
    assert facts["input_channels_last"] is True
    assert facts["loader_workers"] == 2 and facts["child_processes"] == 2
    # the repeated blocks are wrapped, and each block's forward runs again in backward (recomputation)
    assert facts["checkpointing"] == {"method": "torch.utils.checkpoint", "container": "1", "blocks": 2}
    assert facts["block_forwards_per_step"] == 2


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
