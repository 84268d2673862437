"""Putting a file or a directory into place whole or not at all: the one home of
the tool's write-then-rename.

A file's bytes go to a temporary sibling that is flushed to disk and renamed
over the target, so a kill or a full disk leaves the previous file or the new
one, never half of one; a directory is built beside its place and renamed into
it when complete. After the rename the parent directory is flushed too, so the
new entry survives a crash of the machine.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from vllm_fork import faults


def fsync_dir(directory: Path) -> None:
    """Flush ``directory``'s entries (a rename in it) to disk, where the system can."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # not every file system can sync a directory
        pass
    finally:
        os.close(fd)


def _share_mode(path: Path) -> None:
    """The mode of a new file under the umask (0644 usually), not a temp file's 0600."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def place_file(tmp: Path, target: Path, *, shared: bool = False, fault: str | None = None) -> None:
    """Rename the complete file ``tmp`` (a sibling of ``target``, written by the
    caller) over ``target``: its bytes are flushed first, the directory after.
    ``shared``: it gets the mode of a new file under the umask (a file to share,
    such as a download or a wheel). ``fault``: a fault point hit just before the
    rename (faults.py). ``tmp`` is removed when the rename does not happen."""
    try:
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        if shared:
            _share_mode(tmp)
        if fault is not None:
            faults.point(fault)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def write_bytes_atomic(
    path: Path, data: bytes, *, fault: str | None = None, shared: bool = False
) -> None:
    """Write ``data`` to ``path`` atomically (``fault``: a fault point hit after the
    bytes are written, before they are flushed; ``shared``: see :func:`place_file`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fault is not None:
                faults.point(fault)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    place_file(tmp, path, shared=shared)


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` (UTF-8) to ``path`` atomically."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, data: Any, *, indent: int = 2) -> None:
    """``data`` as indented, key-sorted JSON with a final newline, atomically."""
    text = json.dumps(data, indent=indent, sort_keys=True) + "\n"
    write_bytes_atomic(path, text.encode())


def copy_atomic(source: Path, target: Path, *, shared: bool = False) -> None:
    """A copy of the file ``source`` at ``target``, whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    place_file(tmp, target, shared=shared)


def place_dir(staging: Path, dest: Path, *, fault: str | None = None) -> None:
    """Rename the complete directory ``staging`` (on ``dest``'s file system) to
    ``dest``, which must not exist or be an empty directory; the parent is flushed
    after. ``fault``: a fault point hit just before the rename."""
    if fault is not None:
        faults.point(fault)
    os.rename(staging, dest)
    fsync_dir(dest.parent)
