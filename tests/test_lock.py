"""The cache lock says which run holds it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fork.cache import lock_file
from vllm_fork.lock import cache_lock, holder

HOLD = """\
import sys, time
from pathlib import Path
from vllm_fork.lock import cache_lock
with cache_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_the_holder_is_recorded_while_it_holds_the_lock(tmp_path: Path) -> None:
    """The holder records its pid and command line in the lock file; once the lock
    is free again nothing names a holder."""
    cache = tmp_path / "cache"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(cache), "--a-marker-argument"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        who = holder(lock_file(cache))
        assert who is not None and who.startswith(f"pid {child.pid}: ")
        assert "--a-marker-argument" in who
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
        child.wait()
    assert holder(lock_file(cache)) is None
    with cache_lock(cache):
        mine = holder(lock_file(cache))
        assert mine is not None and mine.startswith(f"pid {os.getpid()}: ")
    assert holder(lock_file(cache)) is None


def test_the_wait_line_names_the_holder(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A run that waits for the cache lock says which run holds it (pid and command
    line); the holder keeps the lock until this run is seen waiting."""
    import threading

    cache = tmp_path / "cache"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(cache), "--held-by-the-test"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    released = threading.Event()

    class Release(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "waiting for" in record.getMessage() and child.stdin is not None:
                child.stdin.write("go\n")
                child.stdin.flush()
                released.set()

    handler = Release()
    logging.getLogger("vllm_fork.lock").addHandler(handler)
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        with caplog.at_level(logging.INFO, logger="vllm_fork.lock"), cache_lock(cache):
            pass
    finally:
        logging.getLogger("vllm_fork.lock").removeHandler(handler)
        child.kill()
        child.wait()
    assert released.is_set()
    (line,) = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert line.startswith(f"waiting for another vllm-fork run that holds the cache {cache} ")
    assert f"(pid {child.pid}: " in line and "--held-by-the-test" in line
