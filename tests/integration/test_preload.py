"""A framework's modules imported once by the zygote, not by each probe child (ProbeSpec.preload): real zygotes and
real probe children, with fake framework modules that write down which process imported them."""

import json
import os

import pytest

from tune_advisor import api, frameworks, knobs
from tune_advisor.probe import runner
from tune_advisor.probe.result import Status
from tune_advisor.probe.spec import ProbeSpec

from ..conftest import FAST, WORKLOADS


@pytest.fixture
def marked(tmp_path, monkeypatch):
    """Fake framework modules on the children's path that each append "name pid" to a file as they are imported
    (`fake_fw`; `fake_threaded_fw` also starts a thread), and a workload importing them; returns
    (run a probe with this preload, the imports seen so far)."""
    lib, marks = tmp_path / "lib", tmp_path / "marks"
    lib.mkdir()
    mark = f"import os\nwith open({str(marks)!r}, 'a') as f:\n    f.write(f'{{__name__}} {{os.getpid()}}\\n')\n"
    (lib / "fake_fw.py").write_text(mark)
    (lib / "fake_threaded_fw.py").write_text(
        mark + "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    workload = tmp_path / "framework_mlp.py"
    workload.write_text("import fake_fw\nimport fake_threaded_fw\n" + (WORKLOADS / "tiny_mlp.py").read_text())
    # a new zygote for this test: zygotes are kept per environment
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(lib), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setattr(runner, "_unsafe_preloads", set())
    probes = iter(range(100))

    def run(preload):
        spec = ProbeSpec(id=f"p{next(probes)}", workload=str(workload), settings=knobs.full_settings({}),
                         protocol=FAST, preload=preload)
        result = runner.run_probe(spec, tmp_path / "probes")
        assert result.status is Status.OK, result.error
        return [tuple(line.split()) for line in marks.read_text().splitlines()] if marks.exists() else []

    yield run
    for slot in list(runner._zygotes):  # not left for other tests: it has this test's modules on its path
        runner.retire_zygote(slot)


def test_a_zygote_imports_the_modules_once_and_its_children_have_them(marked):
    # WHEN two probes of a framework workload run, their zygote preloading its module
    seen = marked(["fake_fw"])
    seen = marked(["fake_fw"])
    zygote = runner._zygotes[0]
    # THEN the zygote imported it, once; neither child did (it was in their sys.modules when they were forked)
    assert [name for name, _ in seen].count("fake_fw") == 1
    assert ("fake_fw", str(zygote.proc.pid)) in seen
    # AND the module the preload left out was imported by each child itself, as without a preload
    assert [name for name, _ in seen].count("fake_threaded_fw") == 2
    # WHEN a plain probe follows (one not preloading it)  THEN it forks from a new zygote, and imports it itself
    seen = marked([])
    assert runner._zygotes[0] is not zygote and zygote.proc.poll() is not None
    assert [name for name, _ in seen].count("fake_fw") == 2


def test_an_import_error_in_a_preload_is_not_fatal(marked):
    # WHEN a probe's preload names a module that does not import
    seen = marked(["no_such_framework_module", "fake_fw"])
    # THEN the probe runs as usual, the zygote imported the others, and it is not asked for the failed one again
    assert ("fake_fw", str(runner._zygotes[0].proc.pid)) in seen
    served = runner._zygotes[0]
    marked(["no_such_framework_module", "fake_fw"])
    assert runner._zygotes[0] is served and served.preloaded == ["no_such_framework_module", "fake_fw"]


def test_a_module_that_starts_a_thread_is_not_forked_after(marked):
    # WHEN a probe's zygote preloads a module whose import starts a thread
    seen = marked(["fake_threaded_fw", "fake_fw"])
    # THEN that zygote ended before forking anything, and the probe forked from one that preloaded only the other,
    # its child importing the threaded module itself
    zygote = str(runner._zygotes[0].proc.pid)
    assert runner._unsafe_preloads == {"fake_threaded_fw"} and runner._zygotes[0].preloaded == ["fake_fw"]
    threaded = [pid for name, pid in seen if name == "fake_threaded_fw"]
    assert len(threaded) == 2 and zygote not in threaded  # the ended zygote's import, then the child's
    assert ("fake_fw", zygote) in seen


def test_a_framework_probe_has_its_zygote_preload_the_framework(tmp_path):
    # WHEN a LightningModule workload is probed
    api.probe(WORKLOADS / "tiny_scheduled.py", device="cpu", protocol=FAST, workdir=tmp_path)
    # THEN its spec, and the inspection's before it, ask for Lightning's modules, and the zygote that forked their
    # children imported them
    wanted = frameworks.modules({"name": "lightning"}, WORKLOADS / "tiny_scheduled.py")
    assert json.loads((tmp_path / "inspect.spec.json").read_text())["preload"] == wanted
    assert json.loads((tmp_path / "probe.spec.json").read_text())["preload"] == wanted
    assert runner._zygotes[0].preloaded == wanted
