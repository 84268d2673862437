"""Run git as a subprocess, raising :class:`GitError` with its stderr on failure."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from vllm_fork.errors import GitError, fs_fault

# what git's stderr says (in the C locale) when a write was refused by the file system
_FS_TEXTS = tuple((code, os.strerror(code)) for code in (errno.ENOSPC, errno.EROFS, errno.EDQUOT))


def git_env(extra: Mapping[str, str] | None = None, *, isolated: bool = False) -> dict[str, str]:
    """The environment for a git call.

    ``isolated`` drops the user's global and system git configuration so that
    output that must be byte-stable (format-patch, imports) does not depend on
    personal settings such as ``diff.noprefix`` or ``format.signOff``.
    """
    env = dict(os.environ)
    env.setdefault("LC_ALL", "C")
    env["GIT_TERMINAL_PROMPT"] = "0"
    if isolated:
        env["GIT_CONFIG_GLOBAL"] = os.devnull
        env["GIT_CONFIG_NOSYSTEM"] = "1"
    if extra:
        env.update(extra)
    return env


def run_git(
    args: Sequence[str | os.PathLike[str]],
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    input: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git ARGS`` and return the completed process (stdout/stderr as bytes).

    ``env`` replaces the environment (use :func:`git_env` to build one); when
    ``check`` is true a non-zero exit raises :class:`GitError` with git's stderr.
    """
    cmd = ["git", *(os.fspath(a) for a in args)]
    try:
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            env=dict(env) if env is not None else git_env(),
            input=input,
            capture_output=True,
        )
    except FileNotFoundError as exc:
        raise GitError("git is not installed or not on PATH") from exc
    if check and proc.returncode != 0:
        stderr = proc.stderr.decode(errors="replace").strip()
        for code, text in _FS_TEXTS:
            if text in stderr:  # git hit a full or read-only file system: not a git failure
                where = cwd if cwd is not None else Path.cwd()
                raise fs_fault(OSError(code, text), where, f"running git {cmd[1]}")
        raise GitError(f"git {' '.join(cmd[1:4])}... failed (exit {proc.returncode}): {stderr}")
    return proc


def git_out(
    args: Sequence[str | os.PathLike[str]],
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run git and return its stdout as text, stripped of the trailing newline."""
    return run_git(args, cwd=cwd, env=env).stdout.decode().rstrip("\n")


def ref_exists(repo: Path, ref: str) -> bool:
    proc = run_git(["--git-dir", repo, "rev-parse", "--verify", "-q", ref], check=False)
    return proc.returncode == 0
