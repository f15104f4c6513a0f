"""Every way a workload file can be wrong ends in exit code 2 with file, line and fix — never a traceback."""

import pytest

from ..conftest import BAD, WORKLOADS


@pytest.mark.parametrize("name, expected", [
    ("syntax_error.py", ["syntax_error.py:16", "syntax error: '(' was never closed"]),
    ("missing_build_model.py", ["no build_model() defined", "found 'build_modle'", "fix: define build_model()"]),
    ("import_error.py", ["import_error.py:", "cannot import", "torchvison", "fix: install the missing module"]),
    ("build_raises.py", ["build_raises.py:", "build_dataset() raised FileNotFoundError", "train.bin"]),
    ("unknown_knob.py", ["BASELINE: unknown knob 'batchsize'", "did you mean 'batch_size'", "valid knobs:"]),
    ("bad_knob_value.py", ["SEARCH: ['amp']", "'fp8' is not a valid value", "valid: off, bf16, fp16"]),
    ("bad_batch.py", ["the batch is a Tensor, which the default loss cannot handle", "define compute_loss"]),
    ("not_python.yaml", ["not_python.yaml: not a Python file"]),
])
def test_bad_workload_exits_2_with_a_clear_message(cli, name, expected):
    # WHEN the user points the tool at a broken workload file
    result = cli("probe", BAD / name)
    # THEN it exits 2 with one clear message naming the problem, and no traceback
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    for fragment in expected:
        assert fragment in text
    assert "Traceback" not in result.output


def test_missing_file_exits_2(cli, tmp_path):
    result = cli("analyze", tmp_path / "model.py", "-o", tmp_path / "out")
    assert result.exit_code == 2 and "no such file" in result.output


def test_debug_shows_the_traceback(cli):
    result = cli("--debug", "probe", BAD / "unknown_knob.py")
    assert result.exit_code == 2 and "Traceback" in result.output


def test_set_with_unknown_knob_or_inapplicable_value_exits_2(cli):
    result = cli("probe", WORKLOADS / "tiny_mlp.py", "--set", "batchsize=4")
    assert result.exit_code == 2 and "unknown knob 'batchsize'" in result.output
    result = cli("probe", WORKLOADS / "tiny_mlp.py", "--set", "amp=fp16")
    assert result.exit_code == 2 and "needs a CUDA device" in result.output
    result = cli("probe", WORKLOADS / "tiny_mlp.py", "--set", "channels_last=true")
    assert result.exit_code == 2 and "no convolution layers" in result.output
