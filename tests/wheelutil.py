"""Write small synthetic wheels (valid RECORD) and edit them, for build tests."""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

from vllm_fork.build.wheelfile import record_digest


def write_wheel(path: Path, files: dict[str, bytes], version: str, tag: str) -> Path:
    """A wheel holding ``files`` plus METADATA, WHEEL and a correct RECORD."""
    dist_info = f"vllm-{version}.dist-info"
    members = dict(files)
    members[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.4\nName: vllm\nVersion: {version}\n".encode()
    )
    members[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
    )
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for name, data in members.items():
        writer.writerow([name, record_digest(data), str(len(data))])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    members[f"{dist_info}/RECORD"] = out.getvalue().encode()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def replace_member(src: Path, dst: Path, member: str, data: bytes) -> Path:
    """Copy wheel ``src`` to ``dst`` with ``member``'s bytes replaced, RECORD untouched."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, data if info.filename == member else zin.read(info.filename))
    return dst


def version_py(version: str) -> bytes:
    """A ``vllm/_version.py`` as setuptools-scm writes it."""
    return f"__version__ = version = '{version}'\n".encode()
