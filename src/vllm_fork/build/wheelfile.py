"""Read a wheel: its metadata, its RECORD (checked against the members), file hashes."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from vllm_fork.errors import ForkError


class WheelError(ForkError):
    """A file that is not a readable wheel."""


def record_digest(data: bytes) -> str:
    """The RECORD form of a sha256: ``sha256=<urlsafe base64, no padding>``."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


@dataclass(frozen=True)
class WheelName:
    name: str
    version: Version
    build: tuple[int, str] | tuple[()]
    tags: frozenset[Tag]


def parse_name(path: Path) -> WheelName:
    try:
        name, version, build, tags = parse_wheel_filename(Path(path).name)
    except InvalidWheelFilename as exc:
        raise WheelError(f"{Path(path).name}: {exc}") from None
    return WheelName(str(name), version, build, frozenset(tags))


class Wheel:
    """An open wheel file (read only)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise WheelError(f"{self.path}: not a readable wheel ({exc})") from None
        self.name = parse_name(self.path)
        infos = [n for n in self._zip.namelist() if n.endswith(".dist-info/WHEEL")]
        if len(infos) != 1:
            raise WheelError(f"{self.path.name}: expected one .dist-info/WHEEL, found {len(infos)}")
        self.dist_info = infos[0].rsplit("/", 2)[0]

    def __enter__(self) -> Wheel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._zip.close()

    def names(self) -> list[str]:
        return [n for n in self._zip.namelist() if not n.endswith("/")]

    def read(self, member: str) -> bytes:
        try:
            return self._zip.read(member)
        except KeyError:
            raise WheelError(f"{self.path.name} has no {member}") from None

    def has(self, member: str) -> bool:
        try:
            self._zip.getinfo(member)
        except KeyError:
            return False
        return True

    def _headers(self, member: str) -> dict[str, list[str]]:
        text = self.read(f"{self.dist_info}/{member}").decode("utf-8")
        msg = HeaderParser().parsestr(text)
        out: dict[str, list[str]] = {}
        for key, value in msg.items():
            out.setdefault(key, []).append(value)
        return out

    @property
    def metadata_version(self) -> str:
        return self._headers("METADATA")["Version"][0]

    @property
    def wheel_tags(self) -> list[str]:
        return self._headers("WHEEL").get("Tag", [])

    def requires(self) -> list[str]:
        return self._headers("METADATA").get("Requires-Dist", [])

    def check_record(self) -> list[str]:
        """Problems of RECORD against the members: empty when every hash and size matches."""
        record_name = f"{self.dist_info}/RECORD"
        problems: list[str] = []
        rows = list(csv.reader(io.StringIO(self.read(record_name).decode("utf-8"))))
        listed: dict[str, tuple[str, str]] = {}
        for row in rows:
            if not row:
                continue
            if len(row) != 3:
                problems.append(f"RECORD: malformed row {row!r}")
                continue
            path, digest, size = row
            if path in listed:
                problems.append(f"RECORD: {path} listed twice")
            listed[path] = (digest, size)
        members = set(self.names())
        for path, (digest, size) in sorted(listed.items()):
            if path == record_name:
                continue
            if path not in members:
                problems.append(f"{path}: in RECORD but not in the wheel")
                continue
            if not digest.startswith("sha256="):
                problems.append(f"{path}: RECORD has no sha256 hash")
                continue
            data = self.read(path)
            if record_digest(data) != digest:
                problems.append(f"{path}: content does not match its RECORD hash")
            elif size and int(size) != len(data):
                problems.append(f"{path}: size {len(data)} does not match RECORD ({size})")
        for path in sorted(members - set(listed)):
            problems.append(f"{path}: in the wheel but not in RECORD")
        return problems

    def file_hashes(self, *, python_only: bool = False) -> dict[str, str]:
        """sha256 of every member outside .dist-info (only ``*.py`` with python_only)."""
        out = {}
        for name in self.names():
            if name.startswith(self.dist_info + "/"):
                continue
            if python_only and not name.endswith(".py"):
                continue
            out[name] = hashlib.sha256(self.read(name)).hexdigest()
        return out


@dataclass(frozen=True)
class WheelDiff:
    only_first: list[str]
    only_second: list[str]
    differ: list[str]

    @property
    def same(self) -> bool:
        return not (self.only_first or self.only_second or self.differ)


def diff_wheels(first: Path, second: Path, *, python_only: bool = False) -> WheelDiff:
    """Members (outside .dist-info) that only one wheel has, or whose content differs."""
    with Wheel(first) as a, Wheel(second) as b:
        ha, hb = a.file_hashes(python_only=python_only), b.file_hashes(python_only=python_only)
    return WheelDiff(
        only_first=sorted(set(ha) - set(hb)),
        only_second=sorted(set(hb) - set(ha)),
        differ=sorted(k for k in set(ha) & set(hb) if ha[k] != hb[k]),
    )
