"""Writing a file whole or not at all: the bytes go to a temporary sibling that is
flushed to disk and renamed over the target, so a kill or a full disk leaves the
previous file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from vllm_fork import faults


def write_bytes_atomic(path: Path, data: bytes, *, fault: str | None = None) -> None:
    """Write ``data`` to ``path`` atomically (``fault``: a fault point hit after the
    bytes are written, before they are flushed; see faults.py)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fault is not None:
                faults.point(fault)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented, key-sorted JSON with a final newline, atomically."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    write_bytes_atomic(path, text.encode())
