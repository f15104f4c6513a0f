"""Probe scratch folders left behind by a tune-advisor process that was killed are swept by the next one."""

import os
import subprocess
import sys

from tune_advisor.probe import runner


def test_scratch_folders_of_dead_processes_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    # GIVEN scratch folders of a process that has exited, of this (live) process, and one of another naming
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    folders = {name: tmp_path / name for name in (f"ta-{dead}-p003-abc", f"ta-{os.getpid()}-p004-def", "ta-p005-ghi")}
    for folder in folders.values():
        (folder / "pymp-x").mkdir(parents=True)
    monkeypatch.setattr(runner, "scratch_base", lambda: str(tmp_path))
    monkeypatch.setattr(runner, "_swept", False)
    # WHEN a probe is about to start
    runner.sweep_scratch()
    # THEN only the dead process's folder is gone
    assert {p.name for p in tmp_path.iterdir()} == set(folders) - {f"ta-{dead}-p003-abc"}
    # AND the sweep runs once per process
    (tmp_path / f"ta-{dead}-p006-jkl").mkdir()
    runner.sweep_scratch()
    assert (tmp_path / f"ta-{dead}-p006-jkl").exists()
