"""`vllm-fork materialize`: a git work tree of a base plus its series.

The tree is a local clone of the cached upstream repository (objects are
hardlinked), on branch ``fork`` at ``upstream/<V>``, with one commit per
patch applied by ``git am``. The base version is recorded in the clone's
config (``vllm-fork.base``) for ``export``.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.errors import ForkError, GitError, PatchFailedError, WorkTreeError
from vllm_fork.git import FORK_EMAIL, FORK_NAME, git_env, git_out, run_git
from vllm_fork.sources.upstream import ensure_upstream, tag_for
from vllm_fork.workspace import Workspace

BRANCH = "fork"
BASE_KEY = "vllm-fork.base"


@dataclass(frozen=True)
class MaterializeResult:
    path: Path
    version: str
    applied: int


def _check_target(dest: Path) -> bool:
    """Refuse a non-empty or non-directory target; return True when we must create it."""
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise WorkTreeError(f"{dest} exists and is not a directory; refusing to use it")
    if dest.is_dir():
        if any(dest.iterdir()):
            raise WorkTreeError(f"{dest} is not empty; refusing to materialize into it")
        return False
    return True


def _clear(dest: Path, created: bool) -> None:
    if created:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def am_env() -> dict[str, str]:
    """Fixed committer identity so that the same series gives the same commit ids."""
    return git_env(
        {"GIT_COMMITTER_NAME": FORK_NAME, "GIT_COMMITTER_EMAIL": FORK_EMAIL},
        isolated=True,
    )


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def patch_hunks(patch: Path) -> dict[str, list[tuple[int, int, str]]]:
    """Per file of a patch: (old start, old length, hunk header) of each hunk."""
    hunks: dict[str, list[tuple[int, int, str]]] = {}
    current: str | None = None
    for line in patch.read_text(errors="replace").splitlines():
        if line.startswith("diff --git "):
            current = None
        elif line.startswith("--- "):
            old = line[4:]
            current = old[2:] if old.startswith("a/") else None
        elif line.startswith("+++ ") and current is None:
            new = line[4:]
            current = new[2:] if new.startswith("b/") else new
        elif current is not None and (m := _HUNK.match(line)):
            length = int(m.group(2)) if m.group(2) is not None else 1
            hunks.setdefault(current, []).append((int(m.group(1)), length, line))
    return hunks


def explain_failure(tree: Path, patch: Path) -> list[str]:
    """Which files and hunks of ``patch`` do not apply to the tree's current state."""
    proc = run_git(["apply", "--check", "-v", patch], cwd=tree, check=False)
    text = proc.stderr.decode(errors="replace")
    hunks = patch_hunks(patch)
    problems: list[str] = []
    for line in text.splitlines():
        m = re.match(r"error: patch failed: (.+):(\d+)$", line)
        if m:
            path, start = m.group(1), int(m.group(2))
            headers = [h for s, _, h in hunks.get(path, []) if s == start]
            where = headers[0] if headers else f"line {start}"
            problems.append(f"{path}: hunk {where} does not apply")
            continue
        m = re.match(r"error: (.+): (does not exist in index|No such file or directory)$", line)
        if m:
            problems.append(f"{m.group(1)}: file to patch does not exist in the base")
            continue
        m = re.match(r"error: (.+): already exists in (index|working directory)$", line)
        if m:
            problems.append(f"{m.group(1)}: file to create already exists")
    if not problems:
        detail = text.strip().splitlines()
        problems.append(detail[-1] if detail else "git am failed (no detail from git apply)")
    return problems


def apply_series(tree: Path, patches: tuple[Path, ...]) -> int:
    """Apply ``patches`` one ``git am`` each; on failure abort and raise PatchFailedError."""
    env = am_env()
    for count, patch in enumerate(patches):
        proc = run_git(
            ["am", "--keep", "--3way", "--committer-date-is-author-date", "--quiet", patch],
            cwd=tree,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            run_git(["am", "--abort"], cwd=tree, env=env, check=False)
            problems = explain_failure(tree, patch)
            raise PatchFailedError(
                f"patch {patch.name} (#{count + 1} of {len(patches)}) does not apply:\n  "
                + "\n  ".join(problems),
            )
    return len(patches)


def materialize(
    config: Workspace, version: str | None, dest: Path, *, keep_failed: bool = False
) -> MaterializeResult:
    """Create ``dest`` as the work tree of base ``version`` plus its series."""
    base = config.base(version)
    dest = dest.absolute()
    created = _check_target(dest)
    series = config.series(base.version)
    tag = ensure_upstream(config, base)
    done = False
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        repo = config.upstream_repo
        run_git(["clone", "-q", "--local", "--no-checkout", repo, dest], env=git_env(isolated=True))
        others = [
            ref
            for ref in git_out(
                ["for-each-ref", "--format=%(refname)", "refs/tags"], cwd=dest
            ).splitlines()
            if ref != f"refs/tags/{tag}"
        ]
        if others:
            run_git(
                ["update-ref", "--stdin"],
                cwd=dest,
                input="".join(f"delete {ref}\n" for ref in others).encode(),
            )
        run_git(["remote", "remove", "origin"], cwd=dest)
        run_git(["config", BASE_KEY, base.version], cwd=dest)
        run_git(["checkout", "-q", "-b", BRANCH, tag_for(base.version)], cwd=dest)
        try:
            applied = apply_series(dest, series.patches)
        except PatchFailedError as exc:
            if keep_failed:
                done = True
                head = git_out(["log", "-1", "--format=%s", "HEAD"], cwd=dest)
                raise PatchFailedError(
                    f"{exc}\n{dest} was kept for inspection at the last commit that applied: {head}"
                ) from None
            raise PatchFailedError(
                f"{exc}\n{dest} was removed (use --keep-failed to keep it)"
            ) from None
        done = True
        return MaterializeResult(dest, base.version, applied)
    except GitError as exc:
        raise ForkError(f"materialize of {base.version} into {dest} failed: {exc}") from exc
    finally:
        if not done:
            _clear(dest, created)
