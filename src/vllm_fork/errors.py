"""Errors raised by the tool. The CLI turns each into one clear message.

Exit codes (documented in docs/reliability.md, checked by tests/test_faults.py):
0 success, 1 the operation failed, 2 bad command-line input or a directory
that cannot be used, 3 bad configuration (bases.toml, pip), 4 a file-system
fault (read-only or unwritable cache, a path under a regular file),
70 an internal error (a bug: please report it), 130 interrupted (Ctrl-C),
143 terminated (SIGTERM).
"""

from __future__ import annotations

import errno
import os
from enum import IntEnum


class ExitCode(IntEnum):
    """The exit statuses of the command line, named once (docs/reliability.md)."""

    OK = 0
    FAILED = 1  # the operation failed
    USAGE = 2  # bad command-line input, a refused request
    CONFIG = 3  # bad configuration
    FILE_SYSTEM = 4  # a file-system fault
    INTERNAL = 70  # a bug (EX_SOFTWARE)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    TERMINATED = 143  # SIGTERM (128 + SIGTERM)


class ForkError(Exception):
    """Base class: a failure the user can act on. ``exit_code`` is the CLI status."""

    exit_code: int = ExitCode.FAILED


class UsageError(ForkError):
    """Bad command-line input (wrong version, bad directory, ...)."""

    exit_code = ExitCode.USAGE


class ConfigError(ForkError):
    """The repository, bases.toml or the pip configuration cannot be used."""

    exit_code = ExitCode.CONFIG


class CacheError(ForkError):
    """The download cache cannot be written or read (permissions, not a directory)."""

    exit_code = ExitCode.FILE_SYSTEM


class FileSystemFault(CacheError):
    """A file system that refused a write: full, read-only, over quota (exit 4)."""


# errno values that say the file system, not the data, is at fault
FS_FAULTS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EIO})


def is_fs_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a file system refusing (full, read-only, ...), not bad data."""
    return isinstance(exc, OSError) and exc.errno in FS_FAULTS


def fs_fault(exc: OSError, path: str | os.PathLike[str], doing: str) -> FileSystemFault:
    """The one-line error for ``exc`` (a full or read-only file system) at ``path``."""
    where = exc.filename if exc.filename else path
    return FileSystemFault(
        f"file-system fault at {where}: {exc.strerror or exc} while {doing} (free space "
        "or make it writable; the cache can be moved with VLLM_FORK_CACHE_DIR)"
    )


class CacheCorruptError(ForkError):
    """A cached artifact failed its integrity check and cannot be rebuilt here."""


class UnknownVersionError(UsageError):
    """A version that bases.toml does not pin."""


class NotOnIndexError(ForkError):
    """A pinned file cannot be found on any configured index."""


class NetworkError(ForkError):
    """The index could not be reached or the transfer failed."""


class OfflineError(ForkError):
    """Offline mode is on and the cache cannot serve the request."""


class HashMismatchError(ForkError):
    """A downloaded or cached file does not have the pinned sha256."""


class UnsafeArchiveError(ForkError):
    """An archive member that would escape or harm the extraction directory."""


class GitError(ForkError):
    """A git command failed."""


class SeriesError(ForkError):
    """A patch series or patch header is malformed."""


class PatchFailedError(ForkError):
    """A patch of the series does not apply to its base."""


class WorkTreeError(ForkError):
    """A work tree directory cannot be used as asked."""


class UnsupportedBaseError(UsageError):
    """A base that bases.toml does not mark as supported (no hardening series)."""


class ExportRefusedError(UsageError):
    """An export refused before it wrote anything (exit 2, a refused request): it
    would lose patches (detached or non-tip HEAD, dropped patches), the tree is
    dirty or mid-rebase, a commit changes a path the precompiled build overwrites,
    has a bad header or another author than the fork."""


class UnknownChangeError(SeriesError):
    """A patch names a ``Fork-Change`` that neither the registry nor
    local-changes.toml declares: configuration, not a broken patch."""

    exit_code = ExitCode.CONFIG


class RebaseRefusedError(WorkTreeError):
    """A rebase request refused before anything changed (wrong or dirty tree,
    one already in progress, none to continue): a refused request, exit 2."""

    exit_code = ExitCode.USAGE
