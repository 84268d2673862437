"""Write small synthetic wheels (valid RECORD) and edit them, for build tests."""

from __future__ import annotations

import csv
import io
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.wheel.wheelfile import record_digest


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


@dataclass(frozen=True)
class RawMember:
    """A zip member written byte for byte: ``payload`` is already compressed with
    ``method``; ``crc`` and ``size`` are what the headers claim (they may lie)."""

    name: str
    payload: bytes
    crc: int
    size: int
    method: int = zipfile.ZIP_DEFLATED
    flags: int = 0
    external_attr: int = 0o644 << 16


def deflated(name: str, data: bytes, **fields: int) -> RawMember:
    """A member holding ``data``, deflated, with true headers (unless ``fields`` override)."""
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    payload = c.compress(data) + c.flush()
    return RawMember(name, payload, **{"crc": zlib.crc32(data), "size": len(data), **fields})


def zeros_member(name: str, size: int) -> RawMember:
    """A member inflating to ``size`` zero bytes (a multiple of 1 MiB) from ~size/1000:
    the deflate stream of one MiB is repeated (each block ends with a full flush)."""
    chunk = bytes(1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size >> 20):
        crc = zlib.crc32(chunk, crc)
    return RawMember(name, block * (size >> 20) + c.flush(), crc, size)


def write_raw_zip(path: Path, members: list[RawMember]) -> Path:
    """A zip file of ``members`` as given (no zip64: every size under 4 GiB)."""
    out = io.BytesIO()
    central = io.BytesIO()
    for m in members:
        offset = out.tell()
        name = m.name.encode()
        fixed = (20, m.flags | 0x800, m.method, 0, 0x21, m.crc, len(m.payload), m.size, len(name))
        out.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", *fixed, 0) + name + m.payload)
        central.write(
            struct.pack(
                "<4s6H3L5H2L", b"PK\x01\x02", 0x031E, *fixed, 0, 0, 0, 0, m.external_attr, offset
            )
            + name
        )
    start = out.tell()
    directory = central.getvalue()
    out.write(directory)
    n = len(members)
    out.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, n, n, len(directory), start, 0))
    path.write_bytes(out.getvalue())
    return path
