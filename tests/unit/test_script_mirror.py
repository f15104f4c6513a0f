"""The script's mirrored working directory: it reads the caller's files by relative paths, and what it writes lands
in the scratch folder (also through a folder or file that exists in the caller's tree), listed."""

from __future__ import annotations

import os
import shutil

import torch

from tune_advisor.script.mirror import Mirror


def caller_tree(tmp_path):
    home = tmp_path / "home"
    for name, text in {"configurator.py": "cfg", "data/train.bin": "data", "out/ckpt.pt": "theirs",
                       "log.txt": "line\n"}.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return home, scratch


def test_reads_go_to_the_callers_folder_and_writes_stay_in_scratch(tmp_path, monkeypatch):
    home, scratch = caller_tree(tmp_path)
    before = {p: p.read_bytes() for p in home.rglob("*") if p.is_file()}
    mirror = Mirror(home, scratch)
    monkeypatch.chdir(scratch)
    with mirror:
        # WHEN the script reads its config and data, and writes a checkpoint, a log and new files and folders
        assert open("configurator.py").read() == "cfg" and open("data/train.bin").read() == "data"
        os.makedirs("out", exist_ok=True)
        torch.save({"step": 1}, "out/ckpt.pt")  # written by torch's C++ writer, not Python's open
        with open("log.txt", "a") as log:
            log.write("more\n")
        with open("new.txt", "w") as new:
            new.write("n")
        os.makedirs("runs/a", exist_ok=True)
        shutil.rmtree("runs")
        os.remove("data/train.bin")
    # THEN the caller's tree is as it was, the scratch folder has the writes, and the report's list has them
    assert {p: p.read_bytes() for p in home.rglob("*") if p.is_file()} == before
    assert sorted(os.listdir(home)) == ["configurator.py", "data", "log.txt", "out"]
    assert torch.load(scratch / "out" / "ckpt.pt") == {"step": 1}
    assert (scratch / "log.txt").read_text() == "line\nmore\n"  # appended to a copy
    assert (scratch / "configurator.py").is_symlink() and not (scratch / "data" / "train.bin").exists()
    assert mirror.wrote == ["out", "out/ckpt.pt", "log.txt", "new.txt", "runs", "runs/a", "data/train.bin"]


def test_outside_an_active_mirror_nothing_is_redirected(tmp_path, monkeypatch):
    home, scratch = caller_tree(tmp_path)
    mirror = Mirror(home, scratch)
    monkeypatch.chdir(scratch)
    with mirror:
        pass
    with open("log.txt", "a") as log:  # through the link, as any program's write
        log.write("after\n")
    assert (home / "log.txt").read_text() == "line\nafter\n" and mirror.wrote == []
