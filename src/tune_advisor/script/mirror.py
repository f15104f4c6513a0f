"""The script's working directory in a probe: a scratch folder mirroring the caller's, so that what the script reads
by a relative path (`configurator.py`, `data/`, a config file) is the caller's, while what it writes lands in the
scratch folder, never in the caller's tree, and is listed.

Each entry of the caller's folder is a symlink in the scratch folder: reads go through. A write by a relative (or
scratch) path is seen before it happens by a Python audit hook (`open` for writing, `os.mkdir`, `os.rename`,
`os.remove`, `os.rmdir`, `os.truncate`, `shutil.rmtree`) and by a wrapper around `torch.save` (whose writer opens
the file in C++): a linked folder on its way becomes a real folder of links to its entries (one level, when first
written into), and a linked file about to be written is replaced by a copy (appending) or dropped (truncating). So
the write happens in the scratch folder. Writers in other C extensions that open files by name (h5py, safetensors)
are not seen: into a folder that exists in the caller's tree they would write through its link.

Only in the probe child: an audit hook stays for the process's life, so it acts only while a mirror is active.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import torch

MAX_LISTED = 50  # written paths kept for the report; a script writing many files has the count
# audit event -> (indexes of its path arguments, of its dir_fd arguments, what becomes of a linked file there)
EVENTS = {"os.mkdir": ((0,), (2,), "keep"), "os.rename": ((0, 1), (2, 3), "keep"), "os.remove": ((0,), (1,), "keep"),
          "os.rmdir": ((0,), (1,), "keep"), "os.truncate": ((0,), (), "copy"),
          "shutil.rmtree": ((0,), (1,), "unlink-folder")}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

_active: "Mirror | None" = None
_hooked = False
_busy = threading.local()  # the hook's own file operations raise audit events too


class Mirror:
    """`root` (an empty scratch folder) made to mirror `home`; `wrote`: the paths the script wrote, relative to
    its working directory, in the order first written; `count`: how many distinct paths."""

    def __init__(self, home: Path, root: Path):
        self.home, self.root = Path(home).resolve(), Path(root).resolve()
        self.wrote: list[str] = []
        self.count = 0
        self._seen: set[str] = set()
        self._lock = threading.RLock()
        for entry in self.home.iterdir():
            (self.root / entry.name).symlink_to(entry)

    def __enter__(self) -> "Mirror":
        global _active
        _install()
        _active = self
        return self

    def __exit__(self, *exc) -> None:
        global _active
        _active = None

    def written(self, path: Any, linked_file: str) -> None:
        """Before the script writes `path`: make the write land in the scratch folder, and note it.
        `linked_file`: "copy" (its content is kept: append, r+), "drop" (truncated), "keep" (the link itself is
        what changes: a remove or rename), "unlink-folder" (a folder removed whole)."""
        if isinstance(path, int):  # a file descriptor: opened (and seen) before
            return
        target = Path(os.path.abspath(os.fsdecode(path)))
        try:
            parts = target.relative_to(self.root).parts
        except ValueError:
            return  # outside the scratch folder: a path the script chose (a temporary file, an absolute one)
        if not parts:
            return
        with self._lock:
            self._note("/".join(parts))
            folder = self.root
            for part in parts[:-1]:
                folder = folder / part
                if folder.is_symlink() and folder.is_dir():
                    _unlink_folder(folder)
            _own(target, linked_file)

    def _note(self, shown: str) -> None:
        if shown in self._seen:
            return
        self._seen.add(shown)
        self.count += 1
        if len(self.wrote) < MAX_LISTED:
            self.wrote.append(shown)


def _own(target: Path, linked_file: str) -> None:
    """A link to the caller's tree at `target`, about to be written: made the scratch folder's own."""
    if not target.is_symlink() or linked_file == "keep":
        return
    if target.is_dir():
        _unlink_folder(target)
        return
    source = target.resolve()
    target.unlink()
    if linked_file == "copy" and source.is_file():
        shutil.copy2(source, target)


def _unlink_folder(link: Path) -> None:
    """Replace a link to one of the caller's folders by a real folder of links to its entries."""
    source = link.resolve()
    link.unlink()
    link.mkdir()
    for entry in source.iterdir():
        (link / entry.name).symlink_to(entry)


def _audit(event: str, args: tuple) -> None:
    mirror = _active
    if mirror is None or getattr(_busy, "on", False):
        return
    if event == "open":
        path, mode, flags = args
        if isinstance(mode, str):
            if not set(mode) & set("wax+"):
                return
            linked_file = "drop" if "w" in mode else "copy"
        elif not flags & WRITE_FLAGS:
            return
        else:
            linked_file = "drop" if flags & os.O_TRUNC else "copy"
        _handle(mirror, path, linked_file)
        return
    if event in EVENTS:
        paths, fds, linked_file = EVENTS[event]
        if any(args[i] not in (None, -1) for i in fds):  # relative to an open folder: inside one seen already
            return
        for i in paths:
            _handle(mirror, args[i], linked_file)


def _handle(mirror: Mirror, path: Any, linked_file: str) -> None:
    _busy.on = True
    try:
        mirror.written(path, linked_file)
    finally:
        _busy.on = False


def _install() -> None:
    """The audit hook (once per process; it cannot be removed) and the torch.save wrapper."""
    global _hooked
    if not _hooked:
        sys.addaudithook(_audit)
        torch.save = _saving(torch.save)
        _hooked = True


def _saving(save):
    def save_in_scratch(obj, f, *args, **kwargs):
        if _active is not None and isinstance(f, (str, bytes, os.PathLike)):
            _handle(_active, f, "drop")
        return save(obj, f, *args, **kwargs)

    save_in_scratch.__wrapped__ = save
    return save_in_scratch
