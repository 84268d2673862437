"""An inter-process lock on the cache, so concurrent runs do not race on imports."""

from __future__ import annotations

import fcntl
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vllm_fork.cache import lock_file, staging_dir

_held: dict[Path, int] = {}
_guard = threading.Lock()


@contextmanager
def cache_lock(cache_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``cache_dir`` (re-entrant within one process).

    Downloads and imports stage their files in ``cache_dir/tmp`` only while
    holding the lock, so whatever is there when the lock is first taken was
    left by a killed process and is removed.
    """
    path = lock_file(cache_dir).resolve()
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
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        _clear_stale(staging_dir(cache_dir))
        try:
            yield
        finally:
            with _guard:
                del _held[path]
            fcntl.flock(fh, fcntl.LOCK_UN)


def _clear_stale(tmp: Path) -> None:
    if not tmp.is_dir():
        return
    for entry in tmp.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
