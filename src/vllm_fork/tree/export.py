"""`vllm-fork export`: regenerate a base's series from a work tree's commits.

The commits after ``upstream/<V>`` are written with ``git format-patch``
(the options of docs/series-format.md, git's defaults, the user's git
configuration ignored) so that a materialized and unchanged tree exports
byte-identical patches. They go into the series store (series/store.py): a
patch is added to ``series/pool/`` only when its content is new, the base's
``series`` file is replaced atomically, and pool files no series names any
more are removed. An export that changes nothing writes nothing.
"""

from __future__ import annotations

import logging
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fork.diffs import touched_paths
from vllm_fork.errors import (
    ExportRefusedError,
    SeriesError,
    UnknownChangeError,
)
from vllm_fork.facts import registry
from vllm_fork.facts.names import tag_for
from vllm_fork.git import git_env, git_out, run_git
from vllm_fork.lock import dir_lock
from vllm_fork.series import store
from vllm_fork.series.credits import FORK_FROM
from vllm_fork.series.patches import PatchHeader, parse_patch, validate_header
from vllm_fork.series.precompiled import OVERWRITTEN_PREFIXES
from vllm_fork.sources.workspace import Workspace, recorded_workspace
from vllm_fork.tree.commits import series_commits, tree_base
from vllm_fork.tree.materialize import BRANCH, tree_repository

log = logging.getLogger(__name__)

FORMAT_PATCH = (
    "format-patch",
    "--keep-subject",
    "--zero-commit",
    "--no-signature",
    "--full-index",
    "--no-numbered",
    "--diff-algorithm=myers",
    "--quiet",
)


@dataclass
class ExportResult:
    version: str
    patches: list[str]
    series_dir: Path
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    series_changed: bool = False
    store: store.StoreChange = field(default_factory=store.StoreChange)
    # local changes whose local-changes.toml entry was completed with the paths
    # their exported patches touch (one line each, to print)
    local: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether a file under series/ was written or removed."""
        return self.store.changed


def _check_clean(tree: Path) -> None:
    status = git_out(["status", "--porcelain", "--untracked-files=normal"], cwd=tree)
    if status:
        lines = [line.strip() for line in status.splitlines()]
        more = f", {len(lines) - 10} more" if len(lines) > 10 else ""
        raise ExportRefusedError(
            f"{tree} has uncommitted changes ({', '.join(lines[:10])}{more}); commit them "
            "(or stash) before exporting"
        )
    git_dir = tree / git_out(["rev-parse", "--git-dir"], cwd=tree)
    if any((git_dir / name).exists() for name in ("rebase-apply", "rebase-merge", "MERGE_HEAD")):
        raise ExportRefusedError(
            f"{tree} is in the middle of a rebase, am or merge; finish it first"
        )


def _head_problem(tree: Path) -> str | None:
    """Why HEAD is not the tip of the series branch (None when it is)."""
    head = git_out(["rev-parse", "HEAD"], cwd=tree)
    branch = run_git(["symbolic-ref", "-q", "--short", "HEAD"], cwd=tree, check=False)
    if branch.returncode != 0:
        ahead = run_git(["rev-list", "--count", f"HEAD..{BRANCH}"], cwd=tree, check=False)
        behind = ahead.stdout.decode().strip()
        where = f", {behind} commit(s) behind branch {BRANCH}" if behind not in ("", "0") else ""
        return f"HEAD is detached at {head[:12]}{where}"
    name = branch.stdout.decode().strip()
    if name != BRANCH:
        ahead = run_git(["rev-list", "--count", f"HEAD..{BRANCH}"], cwd=tree, check=False)
        count = ahead.stdout.decode().strip()
        if ahead.returncode == 0 and count != "0":
            return f"HEAD (branch {name}) is {count} commit(s) behind branch {BRANCH}"
    return None


def _number(name: str) -> str:
    return name.split("-", 1)[0]


def export(config: Workspace, tree: Path, *, force: bool = False) -> ExportResult:
    """Write the tree's commits as series/<V>/ of the repository the tree was
    made from (refused when the current checkout is another one).

    Refused (ExportRefusedError, exit 2: a refused request) when the tree is
    dirty or mid-rebase, a patch would change a path the precompiled build
    overwrites, a commit has a bad header or another author than the fork; and
    (unless ``force``) when HEAD is detached or behind the ``fork`` branch, or
    when the export would drop patches from the series: the patches that would
    be added and removed are logged first. A ``Fork-Change`` nobody declared is
    configuration (UnknownChangeError, exit 3).
    """
    tree = tree.absolute()
    version = tree_base(tree)
    # series/ of the repository the tree was made from, never another checkout's
    config = recorded_workspace(config, tree_repository(tree), f"the work tree {tree}")
    tag = tag_for(version)
    _check_clean(tree)
    # Every path a patch will touch, even one a later patch puts back.
    touched = sorted({path for commit in series_commits(tree, tag) for path in commit.paths()})
    forbidden = [p for p in touched if p.startswith(OVERWRITTEN_PREFIXES)]
    if forbidden:
        raise ExportRefusedError(
            "the fork must not change paths that the precompiled build overwrites: "
            + ", ".join(forbidden[:10])
        )

    series_dir = config.series_dir(version)
    with tempfile.TemporaryDirectory(prefix="vllm-fork-export-") as tmp:
        out = Path(tmp)
        run_git([*FORMAT_PATCH, "-o", out, f"{tag}..HEAD"], cwd=tree, env=git_env(isolated=True))
        produced = sorted(out.glob("*.patch"))
        for path in produced:
            try:
                validate_header(parse_patch(path))
            except UnknownChangeError as exc:  # configuration: exit 3, says what to declare
                raise type(exc)(f"commit to export has a bad header: {exc}") from None
            except SeriesError as exc:
                raise ExportRefusedError(f"commit to export has a bad header: {exc}") from None
        headers = [parse_patch(path) for path in produced]
        _check_from(headers)
        result = ExportResult(version, [p.name for p in produced], series_dir)
        contents = [p.read_bytes() for p in produced]
    by_change: dict[str, list[str]] = {}
    for header, data in zip(headers, contents, strict=True):
        paths = touched_paths(data.decode("utf-8", errors="replace"), header.file)
        by_change.setdefault(header.change, []).extend(paths)
    with dir_lock(config.cache_dir, config.series_root):
        current = store.read_base(config.series_root, version)
        listed = current.names if current else []
        _check_loss(tree, listed, series_dir, result.patches, force)
        if not produced and current is None:
            return result
        old = dict(zip(listed, current.contents, strict=True)) if current else {}
        result.written = [
            n for n, d in zip(result.patches, contents, strict=True) if old.get(n) != d
        ]
        result.removed = [n for n in old if n not in result.patches]
        result.series_changed = list(old) != result.patches
        new = store.BaseSeries(
            [store.stem_of(n) for n in result.patches],
            contents,
            current.comments if current else [],
        )
        result.store = store.update_base(config.series_root, version, new)
        result.local = _complete_local(config.root, by_change)
    return result


def _complete_local(root: Path, by_change: dict[str, list[str]]) -> list[str]:
    """A local change's entry (local-changes.toml) gets the files and tests its
    exported patches touch that it does not list yet: derived from the patches
    when `change add` was given none, so the entry is as complete as the
    built-in changes' (docs/changes.md)."""
    lines = []
    for change, paths in by_change.items():
        done = registry.complete_local_change(root, change, paths)
        if done is not None:
            lines.append(done.describe(root / registry.LOCAL_FILE))
    return lines


def _check_from(headers: list[PatchHeader]) -> None:
    """Refuse commits whose author ``series.credits`` would reject later: every
    patch is ``From:`` the fork (upstream authors go in ``Author:`` lines)."""
    wrong = [h for h in headers if h.author != FORK_FROM]
    if wrong:
        shown = "; ".join(f"{h.subject!r} by {h.author!r}" for h in wrong[:5])
        raise ExportRefusedError(
            f"commit(s) to export must be authored by {FORK_FROM!r} (upstream authors go in "
            f"Author: lines, docs/series-format.md): {shown}; fix with `git commit --amend "
            f"--no-edit --author={shlex.quote(FORK_FROM)}` (or `git rebase -i`)"
        )


def _check_loss(
    tree: Path, current: list[str], series_dir: Path, produced: list[str], force: bool
) -> None:
    added = [name for name in produced if name not in current]
    removed = [name for name in current if name not in produced]
    numbers = {_number(name) for name in produced}
    dropped = [name for name in removed if _number(name) not in numbers]
    head = _head_problem(tree)
    if not (dropped or head):
        return
    for name in added:
        log.info("export would add %s", name)
    for name in removed:
        log.info("export would remove %s", name)
    why = "; ".join(
        part
        for part in (
            head,
            f"it would drop {len(dropped)} patch(es) from series/{series_dir.name}: "
            + ", ".join(dropped)
            if dropped
            else None,
        )
        if part
    )
    if force:
        log.warning("exporting anyway (--force): %s", why)
        return
    raise ExportRefusedError(
        f"refusing to export {tree}: {why}; check out branch {BRANCH} at its tip, "
        "or pass --force to export HEAD as it is"
    )
