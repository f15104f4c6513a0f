"""check_file runs in the parent and executes nothing: the errors it can find without importing the file."""

import pytest

from tune_advisor import workload
from tune_advisor.errors import WorkloadError

from ..conftest import BAD


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
