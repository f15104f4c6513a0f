"""check_file runs in the parent and executes nothing: the errors it can find without importing the file."""

import pytest

from tune_advisor import workload
from tune_advisor.errors import WorkloadError

from ..conftest import BAD, WORKLOADS


def test_missing_file(tmp_path):
    with pytest.raises(WorkloadError, match="no such file") as info:
        workload.check_file(tmp_path / "nope.py")
    assert "build_model() and build_dataset()" in str(info.value)


def test_folder_is_not_a_workload(tmp_path):
    with pytest.raises(WorkloadError, match="is a folder"):
        workload.check_file(tmp_path)


def test_yaml_is_not_python():
    with pytest.raises(WorkloadError, match=r"not_python.yaml: not a Python file \(its extension is '.yaml'\)"):
        workload.check_file(BAD / "not_python.yaml")


def test_binary_file_named_py_is_not_python(tmp_path):
    path = tmp_path / "model.py"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(WorkloadError, match="not UTF-8 text"):
        workload.check_file(path)


def test_syntax_error_names_file_and_line():
    with pytest.raises(WorkloadError) as info:
        workload.check_file(BAD / "syntax_error.py")
    assert info.value.line == 16
    assert "syntax_error.py:16: syntax error: '(' was never closed" in str(info.value)


def test_assignment_line_finds_top_level_settings():
    assert workload.assignment_line(BAD / "unknown_knob.py", "BASELINE") is not None
    assert workload.assignment_line(BAD / "unknown_knob.py", "SEARCH") is None


@pytest.mark.parametrize("batch, kind", [({"x": 1}, "dict"), ((1, 2), "pair"), ([1, 2], "pair"),
                                         ((1, 2, 3), "tuple of 3"), (5, "int")])
def test_batch_kind(batch, kind):
    assert workload.batch_kind(batch) == kind


TRAINING_SCRIPT = '''
import argparse
import torch

def collate_fn(batch):
    return torch.stack(batch)

def build_model(args):
    return torch.nn.Linear(args.width, 2)

def main():
    args = argparse.ArgumentParser().parse_args()
    model = build_model(args)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()

if __name__ == "__main__":
    main()
'''


@pytest.mark.parametrize("source, script", [
    (TRAINING_SCRIPT, True),  # contract names of its own, but a build_model(args) and a main block that trains
    (TRAINING_SCRIPT.replace("def build_model(args):", "def build_model(args=None):"), True),  # main trains
    ("def build_model():\n    pass\n\nif __name__ == '__main__':\n    print(build_model())\n", False),
    ("def build_model():\n    pass\n\nif __name__ == '__main__':\n    from train import run\n    run()\n", True),
    ("def build_model(width=8, *, depth=2):\n    pass\n", False),  # nothing required: callable with none
    ("def build_model(args):\n    pass\n", False),  # definitions alone: a workload, to be named as failing
    ("def build_model(args):\n    pass\n\nfor epoch in range(2):\n    pass\n", True),  # it runs code: a script
    ("from models import build_trainer\n", False),
    ("try:\n    import apex\nexcept ImportError:\n    apex = None\n\ndef build_dataset():\n    pass\n", False),
    ("import torch\nmodel = torch.nn.Linear(2, 2)\ntorch.optim.SGD(model.parameters(), lr=1).step()\n", True),
])
def test_a_workload_defines_an_entry_point_callable_with_no_arguments_and_no_training_main(tmp_path, source, script):
    path = tmp_path / "f.py"
    path.write_text(source)
    assert workload.is_script(path) is script


def test_a_workload_whose_entry_point_takes_arguments_says_so_and_names_script_mode(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("def build_model(args):\n    pass\n\n\ndef build_dataset():\n    pass\n")
    with pytest.raises(WorkloadError) as info:
        workload.load(path)
    text = str(info.value)
    assert "build_model(args) takes arguments, and the tool calls build_model() with none" in text
    assert info.value.line == 1 and "--script" in text and "script mode" in text


def test_a_file_taken_for_a_workload_without_build_model_names_script_mode(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("def build_dataset():\n    pass\n")
    with pytest.raises(WorkloadError) as info:
        workload.load(path)
    assert "no build_model() defined" in str(info.value) and f"analyze {path} --script -- ARGS" in str(info.value)


@pytest.mark.parametrize("name, framework", [("tiny_scheduled.py", "lightning"), ("tiny_trainer.py", "hf"),
                                             ("tiny_hf.py", None), ("tiny_mlp.py", None)])
def test_the_framework_a_file_hands_over_is_read_without_running_it(name, framework):
    # the inspection's zygote preloads it (ProbeSpec.preload); tiny_hf.py uses transformers in the plain contract
    assert workload.framework_of(WORKLOADS / name) == framework
