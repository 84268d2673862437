"""Read a wheel nobody vouches for: its metadata, its RECORD, its members' hashes.

This is the one module that opens wheels (``verify``, ``audit``, ``smoke``,
``publish``, the release files). Whatever a wheel's bytes, it gives findings,
never an exception other than :class:`WheelError`:

- RECORD is read as the wheel spec says, field by field: a UTF-8 CSV of
  ``path,sha256=<urlsafe base64, no padding>,size`` rows (only RECORD itself,
  and signature files, may leave hash and size empty);
- members are hashed by streaming them, with an absolute size cap and a
  compression-ratio cap checked against the archive's headers before a byte is
  inflated (the inflater cannot produce more than the header says), so a
  member that inflates to gigabytes from a few megabytes costs no memory;
- member names that could escape an install directory (``..``, absolute,
  backslashes, drive letters, control characters) and symlink, device, fifo
  and socket members are reported by name. Nothing is ever extracted.

:meth:`Wheel.check` lists every finding, one line each, each starting with
the member it is about.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import lzma
import re
import stat
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from vllm_fork.errors import ForkError

MAX_MEMBER_BYTES = 4 << 30  # vLLM's largest member (a CUDA .so) is ~200 MB
MAX_TOTAL_BYTES = 32 << 30  # all members inflated (a vLLM wheel: ~0.6 GB)
MAX_RATIO = 200  # vLLM's most compressible member: ~60:1
RATIO_FLOOR = 1 << 20  # the ratio cap applies to members inflating to more than this
MAX_SMALL_READ = 16 << 20  # members read whole: RECORD, METADATA, the provenance record
MAX_FINDINGS = 200  # findings listed one by one, then counted
_CHUNK = 1 << 20
_SHA256_B64 = re.compile(r"[A-Za-z0-9_-]{43}")
_SIZE = re.compile(r"[0-9]{1,20}")
_SIGNATURES = (".dist-info/RECORD.jws", ".dist-info/RECORD.p7s")


class WheelError(ForkError):
    """A file that is not a readable wheel, or a member that cannot be read."""


def record_digest(data: bytes) -> str:
    """The RECORD form of a sha256: ``sha256=<urlsafe base64, no padding>``."""
    return _record_form(hashlib.sha256(data).digest())


def _record_form(digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def shown(name: str) -> str:
    """A member name fit for one line of a report (quoted when it has odd characters)."""
    return name if name.isprintable() and name.strip() == name and name else ascii(name)


def unsafe_name(name: str) -> str | None:
    """Why ``name`` could not be installed where it says, or None when it is a safe path."""
    if not name or name in ("/", "."):
        return "empty path"
    if not name.isprintable():
        return "control characters in the name"
    if "\\" in name:
        return "backslash in the name"
    if name.startswith("/"):
        return "absolute path"
    if re.match(r"[A-Za-z]:", name):
        return "drive letter"
    if ".." in PurePosixPath(name).parts:
        return "'..' path component"
    return None


_KINDS = (
    (stat.S_ISLNK, "symlink"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISFIFO, "fifo"),
    (stat.S_ISSOCK, "socket"),
)


def special_kind(info: zipfile.ZipInfo) -> str | None:
    """ "symlink", "fifo", ... for a member that is not a regular file or directory."""
    mode = info.external_attr >> 16
    for test, kind in _KINDS:
        if mode and test(mode):
            return kind
    return None


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


@dataclass(frozen=True)
class RecordRow:
    """One row of RECORD, validated: ``digest`` the RECORD form, None when empty."""

    path: str
    digest: str | None
    size: int | None
    line: int


def parse_record(data: bytes, name: str = "RECORD") -> tuple[list[RecordRow], list[str]]:
    """The valid rows of a RECORD and one finding per invalid row (or for the whole file)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [
            f"{name}: not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "the wheel spec requires UTF-8"
        ]
    problems: list[str] = []
    if text.startswith("\ufeff"):
        problems.append(f"{name}: starts with a byte-order mark (ignored)")
        text = text[1:]
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        return [], [f"{name}: NUL byte on line {line}: not a text file"]
    rows: list[RecordRow] = []
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            checked = _check_row(row, line, name)
            if isinstance(checked, str):
                problems.append(checked)
            else:
                rows.append(checked)
    except csv.Error as exc:
        problems.append(f"{name}: line {reader.line_num} is not CSV ({exc}); rows after it unread")
    return rows, problems


def _check_row(row: list[str], line: int, name: str) -> RecordRow | str:
    where = f"{name} line {line}"
    path = row[0]
    if len(row) != 3:
        who = f"{shown(path)}: " if path else ""
        return f"{who}{where} has {len(row)} field(s), expected 3 (path, hash, size)"
    _, digest, size = row
    if not path:
        return f"{where}: empty path"
    why = unsafe_name(path)
    if why:
        return f"{shown(path)}: {where} names an unsafe path ({why})"
    if not digest and not size and (path.endswith("/RECORD") or path.endswith(_SIGNATURES)):
        return RecordRow(path, None, None, line)
    if not digest:
        return f"{shown(path)}: {where} has no hash"
    algorithm, sep, value = digest.partition("=")
    if not sep or algorithm != "sha256":
        return (
            f"{shown(path)}: {where} hash {shown(digest[:80])} is not sha256=<urlsafe base64>"
            if not sep
            else f"{shown(path)}: {where} hash algorithm {shown(algorithm[:40])} is not sha256"
        )
    if not _SHA256_B64.fullmatch(value):
        how = (
            "base64 padding"
            if value.endswith("=")
            else "standard, not urlsafe, base64"
            if set(value) & set("+/")
            else f"{len(value)} characters, not the 43 of a sha256"
            if len(value) != 43
            else "characters outside urlsafe base64"
        )
        return f"{shown(path)}: {where} sha256 value is not urlsafe base64 without padding ({how})"
    if not _SIZE.fullmatch(size):
        return f"{shown(path)}: {where} size {shown(size[:40])} is not a number of bytes"
    return RecordRow(path, digest, int(size), line)


class MemberError(WheelError):
    """A member that is refused (too large, a zip bomb) or damaged."""


# what a damaged member raises while it is inflated (bz2 raises a bare OSError)
_DAMAGE = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, RuntimeError, ValueError)


class Wheel:
    """An open wheel file (read only)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile, ValueError, EOFError) as exc:
            raise WheelError(f"{self.path}: not a readable wheel ({exc})") from None
        try:
            self.name = parse_name(self.path)
            infos = [n for n in self._zip.namelist() if n.endswith(".dist-info/WHEEL")]
            if len(infos) != 1:
                raise WheelError(
                    f"{self.path.name}: expected one .dist-info/WHEEL, found {len(infos)}"
                )
        except WheelError:
            self._zip.close()
            raise
        self.dist_info = infos[0].rsplit("/", 2)[0]
        self.record_name = f"{self.dist_info}/RECORD"

    def __enter__(self) -> Wheel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._zip.close()

    def names(self) -> list[str]:
        return [n for n in self._zip.namelist() if not n.endswith("/")]

    def has(self, member: str) -> bool:
        try:
            self._zip.getinfo(member)
        except KeyError:
            return False
        return True

    def _info(self, member: str) -> zipfile.ZipInfo:
        try:
            return self._zip.getinfo(member)
        except KeyError:
            raise WheelError(f"{self.path.name} has no {member}") from None

    def _refusal(self, info: zipfile.ZipInfo) -> str | None:
        """Why ``info`` is not inflated at all (from the archive's headers), or None."""
        size, packed = info.file_size, info.compress_size
        if info.flag_bits & 0x1:
            return "encrypted member: cannot be checked"
        if size > MAX_MEMBER_BYTES:
            return f"inflates to {size} bytes, more than the {MAX_MEMBER_BYTES} allowed: not read"
        if size > RATIO_FLOOR and size > MAX_RATIO * max(packed, 1):
            return (
                f"inflates to {size} bytes from {packed} (ratio {size // max(packed, 1)}:1, "
                f"more than {MAX_RATIO}:1): refused as a zip bomb, not read"
            )
        return None

    def _chunks(self, info: zipfile.ZipInfo) -> Iterator[bytes]:
        """The member's bytes in chunks, within its caps; :class:`MemberError` otherwise."""
        refusal = self._refusal(info)
        if refusal:
            raise MemberError(f"{shown(info.filename)}: {refusal}")
        seen = 0
        who = shown(info.filename)
        try:
            with self._zip.open(info) as fh:
                while block := fh.read(_CHUNK):
                    seen += len(block)
                    if seen > info.file_size:  # the inflater stops there; never trust it
                        raise MemberError(
                            f"{who}: inflates past its declared {info.file_size} bytes"
                        )
                    yield block
        except _DAMAGE as exc:
            raise MemberError(f"{who}: damaged member ({_one_line(exc)})") from None
        except NotImplementedError as exc:
            raise MemberError(f"{who}: {_one_line(exc)}") from None
        except OSError as exc:
            if exc.errno is not None:  # the wheel file itself could not be read
                raise
            raise MemberError(f"{who}: damaged member ({_one_line(exc)})") from None

    def read(self, member: str, *, limit: int = MAX_SMALL_READ) -> bytes:
        """A small member's bytes (metadata, the provenance record); WheelError when it is
        absent, damaged, refused or larger than ``limit``."""
        info = self._info(member)
        if info.file_size > limit:
            raise MemberError(
                f"{shown(member)}: {info.file_size} bytes, more than the {limit} read whole"
            )
        return b"".join(self._chunks(info))

    def hash_member(self, member: str) -> tuple[str, int]:
        """(RECORD-form sha256, size) of a member, hashed by streaming it."""
        h = hashlib.sha256()
        size = 0
        for block in self._chunks(self._info(member)):
            h.update(block)
            size += len(block)
        return _record_form(h.digest()), size

    def _headers(self, member: str) -> dict[str, list[str]]:
        data = self.read(f"{self.dist_info}/{member}", limit=1 << 20)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WheelError(f"{self.dist_info}/{member}: not UTF-8 ({exc.reason})") from None
        msg = HeaderParser().parsestr(text)
        out: dict[str, list[str]] = {}
        for key, value in msg.items():
            out.setdefault(key, []).append(str(value))
        return out

    @property
    def metadata_version(self) -> str | None:
        versions = self._headers("METADATA").get("Version")
        return versions[0] if versions else None

    @property
    def wheel_tags(self) -> list[str]:
        return self._headers("WHEEL").get("Tag", [])

    def requires(self) -> list[str]:
        return self._headers("METADATA").get("Requires-Dist", [])

    def record(self) -> tuple[list[RecordRow], list[str]]:
        """RECORD's valid rows and its findings (a RECORD that cannot be read is one)."""
        if not self.has(self.record_name):
            return [], [f"{self.record_name}: missing"]
        try:
            data = self.read(self.record_name)
        except WheelError as exc:
            return [], [str(exc)]
        return parse_record(data, self.record_name)

    def record_hashes(self) -> dict[str, str]:
        """RECORD's path -> ``sha256=...`` for its valid rows ("" for RECORD's own row)."""
        return {row.path: row.digest or "" for row in self.record()[0]}

    def unsafe_members(self) -> list[str]:
        """One finding per member whose name or type could harm an install (never extracted)."""
        problems: list[str] = []
        seen: set[str] = set()
        for info in self._zip.infolist():
            name = info.filename
            why = unsafe_name(name.rstrip("/") if name.endswith("/") and name != "/" else name)
            if why:
                problems.append(f"{shown(name)}: unsafe member name ({why}); never extracted")
            kind = special_kind(info)
            if kind:
                target = ""
                if kind == "symlink" and info.file_size <= 4096 and not self._refusal(info):
                    try:
                        raw = b"".join(self._chunks(info))
                        target = f" -> {shown(raw.decode('utf-8', errors='replace'))}"
                    except MemberError:
                        target = ""
                problems.append(
                    f"{shown(name)}: {kind} member{target} (only regular files are allowed); "
                    "never extracted"
                )
            if name in seen:
                problems.append(f"{shown(name)}: in the archive twice")
            seen.add(name)
        return problems

    def check(self) -> list[str]:
        """Every finding about the wheel's members and RECORD; empty when it is sound.

        Each finding is one line starting with the member (or RECORD row) it is about.
        """
        problems = self.unsafe_members()
        rows, record_problems = self.record()
        problems += record_problems
        listed: dict[str, RecordRow] = {}
        for row in rows:
            if row.path in listed:
                problems.append(
                    f"{shown(row.path)}: listed twice in RECORD (lines "
                    f"{listed[row.path].line} and {row.line})"
                )
            listed[row.path] = row
        infos = {i.filename: i for i in self._zip.infolist() if not i.filename.endswith("/")}
        total = 0
        for path, row in sorted(listed.items()):
            info = infos.get(path)
            if info is None:
                problems.append(f"{shown(path)}: in RECORD but not in the wheel")
                continue
            if row.digest is None or unsafe_name(path) or special_kind(info):
                continue  # RECORD itself; the name or type is already a finding
            total += info.file_size
            if total > MAX_TOTAL_BYTES:
                problems.append(
                    f"{shown(path)}: the members so far inflate to more than "
                    f"{MAX_TOTAL_BYTES} bytes: the rest is not checked"
                )
                break
            try:
                digest, size = self.hash_member(path)
            except MemberError as exc:
                problems.append(str(exc))
                continue
            if digest != row.digest:
                problems.append(f"{shown(path)}: content does not match its RECORD hash")
            elif row.size is not None and row.size != size:
                problems.append(f"{shown(path)}: size {size} does not match RECORD ({row.size})")
        if rows or not record_problems:
            for path in sorted(set(infos) - set(listed)):
                if path != self.record_name:
                    problems.append(f"{shown(path)}: in the wheel but not in RECORD")
                    refusal = self._refusal(infos[path])
                    if refusal:
                        problems.append(f"{shown(path)}: {refusal}")
        return problems

    def check_record(self) -> list[str]:
        """Findings of :meth:`check` (the name older callers use)."""
        return self.check()

    def file_hashes(self, *, python_only: bool = False) -> dict[str, str]:
        """sha256 of every member outside .dist-info (only ``*.py`` with python_only);
        hashed by streaming, within the caps (MemberError otherwise)."""
        out = {}
        for name in self.names():
            if name.startswith(self.dist_info + "/"):
                continue
            if python_only and not name.endswith(".py"):
                continue
            h = hashlib.sha256()
            for block in self._chunks(self._info(name)):
                h.update(block)
            out[name] = h.hexdigest()
        return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text or type(exc).__name__


def format_findings(problems: list[str]) -> list[str]:
    """``problems`` as report lines, at most :data:`MAX_FINDINGS` of them, then a count."""
    if len(problems) <= MAX_FINDINGS:
        return list(problems)
    return problems[:MAX_FINDINGS] + [f"(+{len(problems) - MAX_FINDINGS} more findings)"]


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
