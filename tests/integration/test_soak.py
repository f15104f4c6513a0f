"""Soak: `analyze` on every fixture and every bad fixture in one process leaves nothing behind."""

import os
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest

from tune_advisor import api, environment, rundir
from tune_advisor.errors import TuneAdvisorError
from tune_advisor.probe import runner

from ..conftest import BAD, FAST, FIXTURES, tagged_processes


def open_fds() -> int:
    """This process's open descriptors, less those meant to live as long as it: the long-lived zygotes' pipes (a
    second zygote starts with the first lockstep pair) and the font files matplotlib's bounded font cache keeps
    open once a report draws its first chart. Counted with them, the test passed only after other tests had made
    both (run alone it read 16 descriptors, then 20)."""
    zygote_pipes = {f.fileno() for z in runner._zygotes.values() for f in (z.proc.stdin, z.proc.stdout)
                    if not f.closed}
    count = 0
    for fd in os.listdir(f"/proc/{os.getpid()}/fd"):
        try:
            target = os.readlink(f"/proc/{os.getpid()}/fd/{fd}")
        except FileNotFoundError:  # the descriptor listdir itself used
            continue
        count += int(fd) not in zygote_pipes and not ("matplotlib" in target and target.endswith(".ttf"))
    return count


# The fewest confirmation rounds: on the crashing fixtures the default confirmation was most of this test's time.
# Its new zygotes, which a default confirmation starts here only when noise lets a change through to it, are seen
# ended in tests/integration/test_probe_statuses.py and test_lockstep.py.
@pytest.mark.usefixtures("short_confirmation")
def test_analyze_on_every_fixture_leaves_no_process_temp_file_or_open_descriptor(tmp_path, monkeypatch):
    # Temporary files of this process and of every child go to a folder of our own, to be found empty at the end.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    def probe_scratch() -> set:  # per-probe folders: under the temporary folder, or /tmp when its path is long
        # named after the process that started the probe (this one): another run's on a shared /tmp is not ours
        ours = f"{runner.SCRATCH_PREFIX}{os.getpid()}-*"
        return {p for base in {runner.scratch_base(), "/tmp"} for p in Path(base).glob(ours)}

    scratch_before = probe_scratch()
    tag = uuid.uuid4().hex
    monkeypatch.setenv("TUNE_ADVISOR_TEST_TAG", tag)  # marks every process started from here on
    files = (sorted(FIXTURES.glob("*.py")) + sorted(p for p in BAD.iterdir() if p.is_file())
             + sorted((BAD / "scripts").glob("*.py")))  # plain scripts that cannot be measured (script mode)
    assert len(files) >= 18
    fds, outcomes = [], {}
    for path in files:
        # Good fixtures: the baseline only. Bad ones: the grid, so their crashing, out-of-memory and hanging
        # settings run too (and are killed). 20 s: at 10 s, on a machine running two test processes at once,
        # segfault's grid ended before its crashing batch.
        options = ({"budget": "1s"} if path.parent == FIXTURES else
                   {"budget": "20s", "strategy": "grid", "probe_timeout": "4s"})
        try:
            result = api.analyze(path, api.AnalyzeOptions(out=tmp_path / "out" / path.stem, device="cpu",
                                                          protocol=FAST, profile=False, **options))
            outcomes[path.name] = sorted({p.status.value for p in result.probes})
        except TuneAdvisorError as exc:  # the CLI's exit 2: an unusable workload, explained
            outcomes[path.name] = type(exc).__name__
        # THEN nothing it started runs on but the pre-warmed zygote, idle, and nothing was orphaned either
        zygotes = {z.proc.pid for z in runner._zygotes.values()}
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in zygotes]
        assert not left, (path.name, [p.cmdline() for p in left])
        assert {p.pid for p in tagged_processes(tag)} <= zygotes, path.name
        fds.append(open_fds())
    # The loop met the failures it is meant to: crashes, out of memory, hung loader workers, load errors
    assert "crashed" in outcomes["segfault.py"] and "oom" in outcomes["cpu_oom.py"]
    assert "timeout" in outcomes["worker_hang.py"] and outcomes["syntax_error.py"] == "WorkloadError"
    # AND no descriptor leaked from one run to the next
    assert fds[-1] <= fds[0], fds
    # AND no temporary file, probe scratch folder, lock or half-written file is left anywhere
    assert [p.name for p in scratch.iterdir()] in ([], [environment.inductor_cache_dir().rsplit("/", 1)[1]]), \
        "only torch.compile's cache, kept where torch keeps it"
    assert probe_scratch() <= scratch_before, "every probe's scratch folder was removed"
    leftovers = [p for p in (tmp_path / "out").rglob("*")
                 if p.suffix in (".tmp", ".scratch") or p.name in (rundir.LOCK_NAME, ".write-test")]
    assert not leftovers
