"""Named fault points, for the fault-injection tests (tests/test_faults.py).

``VLLM_FORK_FAULT=<point>:<action>`` makes the run stop at ``<point>``:
``kill`` (SIGKILL: no cleanup at all, as after a power cut or the OOM
killer), ``term`` (SIGTERM, as from a service manager), ``enospc`` or
``erofs`` (a write failing as on a full or a read-only file system, with no
file name, as ``write()`` reports it) or ``error`` (an I/O error raised
there). Unset, :func:`point` does nothing.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "VLLM_FORK_FAULT"
_WRITE_FAULTS = {"enospc": errno.ENOSPC, "erofs": errno.EROFS}


def point(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    where, _, action = spec.partition(":")
    if where != name:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    elif action in _WRITE_FAULTS:
        code = _WRITE_FAULTS[action]
        raise OSError(code, os.strerror(code))
    else:
        raise OSError(errno.EIO, f"injected fault at {name}")
