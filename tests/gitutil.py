"""Helpers to make fork commits in a test work tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from vllm_fork.facts.names import FORK_EMAIL, FORK_NAME

DATE = "2026-11-21T12:00:00+00:00"
# The identity of the commits the tests make: a fresh machine (CI) has none.
# Series patches are authored by the fork (series/credits.py; export checks it).
IDENTITY = {
    "GIT_AUTHOR_NAME": FORK_NAME,
    "GIT_AUTHOR_EMAIL": FORK_EMAIL,
    "GIT_COMMITTER_NAME": "vLLM ROCm fork tests",
    "GIT_COMMITTER_EMAIL": "tests@example.invalid",
}


def trailer_block(
    change: str = "ar-rms-pack-gate",
    part: str = "change",
    origin: str = "backport, https://github.com/vllm-project/vllm/pull/42409",
    forwarded: str = "no",
    **extra: str,
) -> str:
    lines = [
        f"Fork-Change: {change}",
        f"Fork-Part: {part}",
        f"Origin: {origin}",
        f"Forwarded: {forwarded}",
    ]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def commit(tree: Path, subject: str, body: str, trailers: str, edits: dict[str, str]) -> None:
    for rel, text in edits.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": FORK_NAME,
        "GIT_AUTHOR_EMAIL": FORK_EMAIL,
        "GIT_COMMITTER_NAME": "Someone Else",
        "GIT_COMMITTER_EMAIL": "someone@example.com",
        "GIT_AUTHOR_DATE": DATE,
        "GIT_COMMITTER_DATE": "2030-01-01T00:00:00+00:00",
    }
    subprocess.run(["git", "add", "-A"], cwd=tree, check=True, env=env)
    subprocess.run(
        ["git", "commit", "-q", "-F", "-"],
        cwd=tree,
        check=True,
        env=env,
        input=f"{subject}\n\n{body}\n\n{trailers}".encode(),
    )


def git(tree: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args],
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **IDENTITY},
    ).stdout
