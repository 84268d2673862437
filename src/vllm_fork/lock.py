"""Inter-process locks: one on the cache, one per work-tree directory.

The run that holds a lock writes its pid, command line and start time into the
lock file; a run that has to wait names it ("waiting for another vllm-fork run
that holds the cache ... (pid N: COMMAND, since TIME)").

Temporary entries the tool makes (in ``<cache>/tmp`` and next to a work tree
being materialized) carry its mark: a name starting with :data:`TMP_PREFIX`
and, for directories, a :data:`MARKER` file inside. Cleanup removes only
marked entries, so nothing a user put there is ever deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from vllm_fork.cache import CacheLayout, lock_file, staging_dir
from vllm_fork.hashing import sha256_bytes

log = logging.getLogger(__name__)

TMP_PREFIX = ".vllm-fork-tmp."
MARKER = ".vllm-fork-owned"

_held: dict[Path, int] = {}
_guard = threading.Lock()


def owned_tempdir(parent: Path, label: str) -> Path:
    """A new directory in ``parent`` marked as the tool's own (see :func:`clear_owned`)."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{label}.", dir=parent))
    (path / MARKER).write_text(f"{os.getpid()}\n")
    return path


def owned_tempfile(parent: Path, label: str) -> Path:
    """A new empty file in ``parent`` marked as the tool's own by its name."""
    parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{label}.", suffix=".part", dir=parent)
    os.close(fd)
    return Path(name)


def is_owned(entry: Path) -> bool:
    if not entry.name.startswith(TMP_PREFIX) or entry.is_symlink():
        return False
    if entry.is_dir():
        return (entry / MARKER).is_file()
    return entry.is_file() and entry.name.endswith(".part")


def alive(pid: int) -> bool:
    """Whether process ``pid`` is running (signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_dead_owned(parent: Path, label: str) -> list[Path]:
    """Remove the marked directories of ``parent`` whose process is gone (a killed
    run); a directory of a run still going is left alone. For places no one lock
    guards, such as the build trees in ``<cache>/work``."""
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        if not entry.name.startswith(TMP_PREFIX + label) or not is_owned(entry):
            continue
        if not entry.is_dir():
            continue
        try:
            pid = int((entry / MARKER).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if alive(pid):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def clear_owned(parent: Path, label: str = "") -> list[Path]:
    """Remove the entries of ``parent`` that the tool marked (only those); return them.

    Callers hold the lock that guards ``parent``'s temporary entries, so a
    marked entry found here was left by a killed run.
    """
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        if not entry.name.startswith(TMP_PREFIX + label) or not is_owned(entry):
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _command_line() -> str:
    """This process's command line, as it was started (interpreter and options too)."""
    return shlex.join(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])


def _record_holder(fh: BinaryIO) -> None:
    """Write who holds the lock into the lock file (the one process that holds it
    writes; a lock file is never renamed, so it is rewritten in place)."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    record = {"pid": os.getpid(), "command": _command_line(), "since": since}
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps(record).encode() + b"\n")
    fh.flush()


def holder(path: Path) -> str | None:
    """Which run holds the lock file ``path``: "pid N: COMMAND, since TIME", as its
    holder recorded it (None: nothing recorded, or that process is gone)."""
    try:
        record = json.loads(path.read_bytes() or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    pid, command = record.get("pid"), record.get("command")
    if not isinstance(pid, int) or not isinstance(command, str) or not alive(pid):
        return None
    return f"pid {pid}: {command}, since {record.get('since', '?')}"


@contextmanager
def _flock(path: Path, what: str) -> Iterator[None]:
    path = path.resolve()
    with _guard:
        depth = _held.get(path, 0)
        _held[path] = depth + 1
    if depth:
        try:
            yield
        finally:
            with _guard:
                _held[path] -= 1
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                who = holder(path)
                log.info(
                    "waiting for another vllm-fork run that holds %s (%s)",
                    what,
                    who or "which one is not recorded",
                )
                fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                _record_holder(fh)
                yield
            finally:
                with contextlib.suppress(OSError):
                    fh.truncate(0)  # no one holds it now
                fcntl.flock(fh, fcntl.LOCK_UN)
    finally:
        with _guard:
            del _held[path]


@contextmanager
def cache_lock(cache_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``cache_dir`` (re-entrant within one process).

    Downloads and imports stage their files in ``cache_dir/tmp`` only while
    holding the lock, so a marked entry there when the lock is first taken
    was left by a killed process and is removed.
    """
    first = lock_file(cache_dir).resolve() not in _held
    with _flock(lock_file(cache_dir), f"the cache {cache_dir}"):
        if first:
            clear_owned(staging_dir(cache_dir))
        yield


@contextmanager
def dir_lock(cache_dir: Path, target: Path) -> Iterator[None]:
    """Hold an exclusive lock on the work-tree directory ``target`` (kept in the cache,
    so nothing is added next to the user's directory)."""
    key = sha256_bytes(str(target).encode())[:32]
    with _flock(CacheLayout(cache_dir).dir_lock(key), str(target)):
        yield
