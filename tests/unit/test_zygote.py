"""The zygote's preload of a framework's modules (probe/zygote.py `_preload`), and how the runner asks for it
(probe/runner.py `start_child`): imported once per zygote, never fatal, never forked from once it started a thread.
The real processes are tests/integration/test_preload.py's."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from tune_advisor import frameworks
from tune_advisor.probe import runner, zygote


@pytest.fixture
def fake_modules(tmp_path, monkeypatch):
    """Modules on sys.path: `fake_plain` (imports, nothing else), `fake_broken` (raises), `fake_threaded` (leaves
    a thread running until the test ends), `fake_exits` (calls exit() at its top level)."""
    (tmp_path / "fake_plain.py").write_text("VALUE = 1\n")
    (tmp_path / "fake_broken.py").write_text("import no_such_module_anywhere\n")
    (tmp_path / "fake_exits.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "fake_threaded.py").write_text(
        "import threading\nSTOP = threading.Event()\nthreading.Thread(target=STOP.wait, daemon=True).start()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    if "fake_threaded" in sys.modules:
        sys.modules["fake_threaded"].STOP.set()
    for name in ("fake_plain", "fake_broken", "fake_exits", "fake_threaded"):
        sys.modules.pop(name, None)


def test_a_preload_imports_its_modules_and_reports_a_failed_import_without_failing(fake_modules):
    # WHEN the zygote preloads a module that imports, one that raises ImportError and one that exits
    report = zygote._preload(["fake_broken", "fake_exits", "fake_plain"])
    # THEN the good one is imported here (its children have it) and the others are reported, not raised
    assert report["imported"] == ["fake_plain"] and "fake_plain" in sys.modules
    assert report["failed"]["fake_broken"] == "ModuleNotFoundError: No module named 'no_such_module_anywhere'"
    assert report["failed"]["fake_exits"] == "SystemExit: 3"
    assert "unsafe" not in report and report["seconds"] >= 0


def test_a_preload_that_starts_a_thread_is_unsafe_and_stops_there(fake_modules):
    # WHEN a module's import leaves a thread running
    report = zygote._preload(["fake_plain", "fake_threaded", "fake_broken"])
    # THEN the report names it as unsafe to fork after, and imports nothing more
    assert report["unsafe"] == {"module": "fake_threaded", "why": "importing it started 1 thread(s)"}
    assert report["imported"] == ["fake_plain", "fake_threaded"] and report["failed"] == {}


def test_a_preload_that_initialises_cuda_is_unsafe(fake_modules, monkeypatch):
    # GIVEN a module whose import initialises CUDA (here: torch says so once it is imported)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: "fake_plain" in sys.modules)
    # THEN forking after it is unsafe: a forked child could not use CUDA
    assert zygote._preload(["fake_plain"])["unsafe"] == {"module": "fake_plain", "why": "importing it initialised CUDA"}


def test_the_framework_modules_come_from_the_workloads_framework(tmp_path):
    workload = tmp_path / "train.py"
    assert frameworks.modules(None, workload) == []
    assert frameworks.modules({"name": "hf"}, workload)[:2] == ["transformers", "transformers.trainer"]
    assert "lightning.pytorch" in frameworks.modules({"name": "lightning", "config": {}}, workload)
    # AND a framework package beside the workload, which its child imports instead (its folder comes first on the
    # child's path), leaves the framework to the child: a module file or a folder, of a dependency too
    (tmp_path / "accelerate").mkdir()
    (tmp_path / "pytorch_lightning.py").write_text("")
    assert frameworks.modules({"name": "hf"}, workload) == frameworks.modules({"name": "lightning"}, workload) == []


class Recorded(runner.Zygote):
    """A zygote without a process: records what it was started with and asked; `threaded` modules are unsafe."""

    threaded: set[str] = set()
    made: list[Recorded] = []

    def __init__(self, python, env, preload=()):
        self.python, self.env, self.ready, self.forked, self.preloaded = python, env, True, False, list(preload)
        self.proc = SimpleNamespace(poll=lambda: None, kill=lambda: None)
        self.started_with, self.asked, self.closed = list(preload), [], False
        Recorded.made.append(self)

    def request(self, message, ready_by=None):
        if "preload" not in message:
            return {"pid": 4242}
        self.asked.append(message["preload"])
        bad = next((name for name in message["preload"] if name in self.threaded), None)
        return {"preload": {"unsafe": {"module": bad, "why": "thread"}} if bad else {}}

    def close(self):
        self.closed = True


@pytest.fixture
def recorded(monkeypatch):
    monkeypatch.delenv("TUNE_ADVISOR_NO_ZYGOTE", raising=False)
    monkeypatch.setattr(runner, "Zygote", Recorded)
    monkeypatch.setattr(runner, "_zygotes", {})
    monkeypatch.setattr(runner, "_unsafe_preloads", set())
    monkeypatch.setattr(Recorded, "made", [])
    monkeypatch.setattr(Recorded, "threaded", set())

    def start(preload):
        return runner.start_child(sys.executable, ["spec", "result"], "log", {"A": "1"}, preload=preload)

    return start


def test_a_zygote_is_asked_for_a_frameworks_modules_once_and_a_plain_probe_gets_one_without_them(recorded):
    # GIVEN a zygote that forked a plain probe (the inspection's)
    recorded([])
    first = Recorded.made[0]
    # WHEN framework probes follow  THEN that zygote imports the framework once, between forks, for all of them
    recorded(["fw", "fw.trainer"])
    recorded(["fw", "fw.trainer"])
    assert Recorded.made == [first] and first.asked == [["fw", "fw.trainer"]]
    # WHEN a plain probe follows  THEN it forks from a new zygote without them: its memory is as it was
    recorded([])
    assert len(Recorded.made) == 2 and first.closed and Recorded.made[1].started_with == []
    # AND a new zygote for a framework probe imports them as it starts (side by side with a partner's: start_zygotes)
    runner.start_zygotes({1: ["fw"]})
    assert Recorded.made[2].started_with == ["fw"]


def test_a_module_whose_import_starts_a_thread_is_left_to_the_children(recorded):
    # GIVEN a framework module whose import starts a thread
    Recorded.threaded = {"threaded"}
    recorded([])
    first = Recorded.made[0]
    # WHEN a probe asks its zygote to preload it  THEN that zygote is ended (no fork after a thread started) and the
    # probe forks from a new one that preloads the rest only
    child = recorded(["fw", "threaded", "after"])
    assert isinstance(child, runner.Forked) and first.closed and first not in runner._zygotes.values()
    assert runner._zygotes[0].started_with == ["fw", "after"]
    # AND later probes leave it to their children too, from that same zygote
    recorded(["fw", "threaded", "after"])
    assert len(Recorded.made) == 2 and runner._zygotes[0].asked == []


def test_without_zygotes_a_framework_probe_starts_a_new_process_as_before(recorded, monkeypatch):
    monkeypatch.setenv("TUNE_ADVISOR_NO_ZYGOTE", "1")
    monkeypatch.setattr(runner, "Spawned", lambda *args: "a new process")
    assert recorded(["fw"]) == "a new process" and Recorded.made == []
