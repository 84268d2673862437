"""Safe extraction of an (untrusted) sdist tarball.

Only regular files and directories are accepted: vLLM sdists contain no
links, so every symlink, hardlink, device or fifo member is refused, as are
absolute paths, ``..`` and ``.git`` components, members outside the single top-level
directory, and setuid/setgid/sticky bits. Ownership is never taken from the
archive. Extraction happens in a temporary directory that is renamed into
place only when every member was extracted.
"""

from __future__ import annotations

import errno
import os
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath

from vllm_fork import faults
from vllm_fork.atomic import place_dir
from vllm_fork.errors import UnsafeArchiveError, fs_fault, is_fs_fault

MAX_TOTAL_BYTES = 4 << 30  # a vLLM sdist unpacks to ~100 MB; refuse archive bombs


def _describe(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"symlink -> {member.linkname}"
    if member.islnk():
        return f"hardlink -> {member.linkname}"
    if member.ischr() or member.isblk():
        return "device file"
    if member.isfifo():
        return "fifo"
    return "special file"


def check_member(member: tarfile.TarInfo, top: str) -> str:
    """Validate one member and return its path relative to ``top``/ ("" for top itself)."""
    name = member.name
    path = PurePosixPath(name)
    if name.startswith("/") or path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(f"refusing archive member {name!r}: absolute path")
    if ".." in path.parts:
        raise UnsafeArchiveError(f"refusing archive member {name!r}: '..' path component")
    if any(part.lower() == ".git" for part in path.parts):
        raise UnsafeArchiveError(f"refusing archive member {name!r}: '.git' path component")
    if "\\" in name or "\x00" in name:
        raise UnsafeArchiveError(f"refusing archive member {name!r}: unusual path characters")
    if not (member.isreg() or member.isdir()):
        raise UnsafeArchiveError(
            f"refusing archive member {name!r}: {_describe(member)} (only regular files "
            "and directories are allowed)"
        )
    if member.mode & 0o7000:
        raise UnsafeArchiveError(
            f"refusing archive member {name!r}: setuid/setgid/sticky mode {oct(member.mode)}"
        )
    parts = [p for p in path.parts if p != "."]
    if not parts or parts[0] != top:
        raise UnsafeArchiveError(
            f"refusing archive member {name!r}: outside the top-level directory {top}/"
        )
    return "/".join(parts[1:])


def _make_filter(top: str):  # type: ignore[no-untyped-def]
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:
        raise UnsafeArchiveError(
            "this Python lacks tarfile extraction filters (PEP 706): use 3.10.12 or newer"
        )

    def _filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        faults.point("unpack.member")
        rel = check_member(member, top)
        if not rel:
            return None
        mode = 0o755 if member.isdir() or member.mode & 0o111 else 0o644
        # None: the owner is not set on extraction (tarfile's documented meaning; its
        # type stubs say int/str)
        member = member.replace(
            name=rel,
            mode=mode,
            uid=None,  # type: ignore[arg-type]
            gid=None,  # type: ignore[arg-type]
            uname=None,  # type: ignore[arg-type]
            gname=None,  # type: ignore[arg-type]
            deep=False,
        )
        try:
            return data_filter(member, dest)
        except tarfile.FilterError as exc:
            raise UnsafeArchiveError(f"refusing archive member {rel!r}: {exc}") from exc

    return _filter


# What a member's name or its place in the archive makes impossible on any disk:
# the archive is at fault (exit 1, naming the member), not the file system.
ARCHIVE_NAME_ERRNOS = frozenset(
    {errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EILSEQ, errno.ELOOP}
)


def _member_name(path: str | None, staging: Path) -> str:
    """The archive member a failed path under ``staging`` stands for."""
    if not path:
        return "?"
    try:
        return str(Path(os.fsdecode(path)).relative_to(staging))
    except ValueError:
        return os.fsdecode(path)


def safe_extract(archive: Path, dest: Path, top: str) -> None:
    """Extract ``archive``'s ``top/`` directory into ``dest`` (which must not exist)."""
    if dest.exists():
        raise UnsafeArchiveError(f"extraction target {dest} already exists")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    except OSError as exc:
        raise fs_fault(exc, dest.parent, f"extracting {archive.name}") from exc
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            total = 0
            for member in members:
                check_member(member, top)
                total += member.size
            if total > MAX_TOTAL_BYTES:
                raise UnsafeArchiveError(f"{archive.name} unpacks to {total} bytes: too large")
            # Every member was checked above; the filter re-checks and strips the top directory.
            tar.extractall(staging, members=members, filter=_make_filter(top))
        place_dir(staging, dest)
    except UnsafeArchiveError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise UnsafeArchiveError(f"{archive.name}: {exc}") from exc
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if not is_fs_fault(exc) and exc.errno in ARCHIVE_NAME_ERRNOS:
            # a name too long, a path too deep, a file where a directory is: the
            # archive's names, whatever the disk
            bad = _member_name(exc.filename, staging)
            raise UnsafeArchiveError(
                f"{archive.name}: member {bad!r} cannot be created: "
                f"{exc.strerror or exc} (the archive's names are at fault, not the disk)"
            ) from exc
        if is_fs_fault(exc) or exc.errno is not None:
            # a full or read-only file system, or a path the tool cannot write: not the
            # archive's fault (a damaged gzip stream raises an OSError without an errno)
            raise fs_fault(exc, dest.parent, f"extracting {archive.name}") from exc
        raise UnsafeArchiveError(
            f"cannot extract {archive.name}: {exc or type(exc).__name__} (a damaged or "
            "truncated archive)"
        ) from exc
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise UnsafeArchiveError(
            f"cannot extract {archive.name}: {exc or type(exc).__name__} (a damaged or "
            "truncated archive)"
        ) from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
