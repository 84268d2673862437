"""`vllm-fork export`: regenerate ``series/<V>/`` from a work tree's commits.

The commits after ``upstream/<V>`` are written with ``git format-patch``
(the options of docs/series-format.md, git's defaults, the user's git
configuration ignored) so that a materialized and
unchanged tree exports byte-identical files. Files whose content did not
change are left untouched; patch files that are no longer produced are
removed; the series file is rewritten only when the list changed.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fork.config import Config
from vllm_fork.errors import GitError, SeriesError, WorkTreeError
from vllm_fork.git import git_env, git_out, run_git
from vllm_fork.series.patches import SERIES_FILE, parse_patch, read_series_file, validate_header
from vllm_fork.sources.upstream import tag_for
from vllm_fork.tree.materialize import BASE_KEY

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
# The precompiled build overwrites these paths with upstream's binaries' files.
FORBIDDEN_PREFIXES = ("vllm/vllm_flash_attn/", "vllm/third_party/")
SERIES_HEADER = "# Patch order for `vllm-fork materialize`; written by `vllm-fork export`.\n"


@dataclass
class ExportResult:
    version: str
    patches: list[str]
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    series_changed: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.written or self.removed or self.series_changed)


def tree_base(tree: Path) -> str:
    """The base version recorded in a work tree by materialize."""
    if not (tree / ".git").exists():
        raise WorkTreeError(f"{tree} is not a git work tree made by `vllm-fork materialize`")
    proc = run_git(["config", "--get", BASE_KEY], cwd=tree, check=False)
    version = proc.stdout.decode().strip()
    if proc.returncode != 0 or not version:
        raise WorkTreeError(
            f"{tree} records no base version (git config {BASE_KEY}); "
            "was it made by `vllm-fork materialize`?"
        )
    return version


def _check_clean(tree: Path) -> None:
    status = git_out(["status", "--porcelain", "--untracked-files=normal"], cwd=tree)
    if status:
        lines = status.splitlines()
        shown = "\n  ".join(lines[:10]) + ("\n  ..." if len(lines) > 10 else "")
        raise WorkTreeError(
            f"{tree} has uncommitted changes; commit them (or stash) before exporting:\n  {shown}"
        )
    git_dir = tree / git_out(["rev-parse", "--git-dir"], cwd=tree)
    if any((git_dir / name).exists() for name in ("rebase-apply", "rebase-merge", "MERGE_HEAD")):
        raise WorkTreeError(f"{tree} is in the middle of a rebase, am or merge; finish it first")


def export(config: Config, tree: Path) -> ExportResult:
    tree = tree.absolute()
    version = tree_base(tree)
    tag = tag_for(version)
    _check_clean(tree)
    try:
        run_git(["merge-base", "--is-ancestor", tag, "HEAD"], cwd=tree)
    except GitError:
        raise WorkTreeError(f"HEAD of {tree} does not descend from {tag}") from None
    merges = git_out(["rev-list", "--merges", f"{tag}..HEAD"], cwd=tree)
    if merges:
        raise WorkTreeError(f"{tree} has merge commits after {tag}; a series must be linear")

    touched = git_out(["diff", "--name-only", "--no-renames", tag, "HEAD"], cwd=tree).splitlines()
    forbidden = [p for p in touched if p.startswith(FORBIDDEN_PREFIXES)]
    if forbidden:
        raise SeriesError(
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
            except SeriesError as exc:
                raise SeriesError(f"commit to export has a bad header: {exc}") from None
        result = ExportResult(version, [p.name for p in produced])
        if not produced and not series_dir.exists():
            return result
        series_dir.mkdir(parents=True, exist_ok=True)
        for path in produced:
            target = series_dir / path.name
            data = path.read_bytes()
            if not target.is_file() or target.read_bytes() != data:
                shutil.copyfile(path, target)
                result.written.append(path.name)
    keep = set(result.patches)
    for stale in sorted(series_dir.glob("*.patch")):
        if stale.name not in keep:
            stale.unlink()
            result.removed.append(stale.name)
    series_file = series_dir / SERIES_FILE
    current = read_series_file(series_dir) if series_file.is_file() else None
    if current != result.patches:
        series_file.write_text(
            SERIES_HEADER + "".join(f"{n}\n" for n in result.patches) + kept_comments(series_file)
        )
        result.series_changed = True
    return result


def kept_comments(series_file: Path) -> str:
    """The comment lines of an existing series file that export did not write
    (e.g. the `# Applied-Upstream:` history a rebase records), kept in order
    after the patch list."""
    if not series_file.is_file():
        return ""
    own = set(SERIES_HEADER.splitlines())
    lines = [
        line
        for line in series_file.read_text().splitlines()
        if line.lstrip().startswith("#") and line not in own
    ]
    return "".join(f"{line}\n" for line in lines)
