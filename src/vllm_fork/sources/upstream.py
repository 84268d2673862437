"""The cached upstream repository: one deterministic root commit per pinned sdist.

``<cache>/upstream.git`` is a bare repository. Importing vLLM <V> unpacks the
verified sdist, records its tree as a parentless commit by a fixed author
dated from the sdist's PKG-INFO, and tags it ``upstream/<V>``. The commit
message carries the sdist's sha256, so an import is reused only for the
exact pinned file.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path

from vllm_fork.errors import GitError, UnsafeArchiveError
from vllm_fork.git import git_env, git_out, ref_exists, run_git
from vllm_fork.lock import cache_lock
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pins import Base
from vllm_fork.sources.unpack import safe_extract
from vllm_fork.workspace import Workspace

UPSTREAM_NAME = "vLLM upstream"
UPSTREAM_EMAIL = "vllm-upstream@users.noreply.github.com"
SHA_TRAILER = "Sdist-SHA256"


def tag_for(version: str) -> str:
    return f"upstream/{version}"


def init_repo(repo: Path) -> None:
    if (repo / "HEAD").is_file():
        return
    repo.parent.mkdir(parents=True, exist_ok=True)
    run_git(["init", "-q", "--bare", repo])
    for key, value in (
        ("gc.auto", "0"),
        ("core.autocrlf", "false"),
        ("core.fileMode", "true"),
        ("core.precomposeUnicode", "false"),
    ):
        run_git(["--git-dir", repo, "config", key, value])


def imported_sha256(repo: Path, version: str) -> str | None:
    """The sdist sha256 recorded in ``upstream/<V>``, or None when not imported."""
    tag = tag_for(version)
    if not (repo / "HEAD").is_file() or not ref_exists(repo, f"refs/tags/{tag}"):
        return None
    value = git_out(
        [
            "--git-dir",
            repo,
            "log",
            "-1",
            f"--format=%(trailers:key={SHA_TRAILER},valueonly,separator=)",
            f"refs/tags/{tag}",
        ]
    )
    return value.strip() or None


def _pkg_info_mtime(sdist: Path, top: str) -> int:
    with tarfile.open(sdist, "r:*") as tar:
        try:
            member = tar.getmember(f"{top}/PKG-INFO")
        except KeyError:
            raise UnsafeArchiveError(f"{sdist.name} has no {top}/PKG-INFO") from None
        return int(member.mtime)


def import_sdist(repo: Path, version: str, sdist: Path, sha256: str, work: Path) -> str:
    """Commit the tree of ``sdist`` to ``repo`` and tag it; return the commit id."""
    top = f"vllm-{version}"
    tree_dir = work / "tree"
    safe_extract(sdist, tree_dir, top)
    date = f"{_pkg_info_mtime(sdist, top)} +0000"
    env = git_env(
        {
            "GIT_DIR": str(repo),
            "GIT_WORK_TREE": str(tree_dir),
            "GIT_INDEX_FILE": str(work / "index"),
            "GIT_AUTHOR_NAME": UPSTREAM_NAME,
            "GIT_AUTHOR_EMAIL": UPSTREAM_EMAIL,
            "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_NAME": UPSTREAM_NAME,
            "GIT_COMMITTER_EMAIL": UPSTREAM_EMAIL,
            "GIT_COMMITTER_DATE": date,
        },
        isolated=True,
    )
    # -f: files matched by .gitignore files inside the sdist are part of the release too.
    run_git(["add", "-A", "-f", "."], cwd=tree_dir, env=env)
    tree = git_out(["write-tree"], env=env)
    message = f"vLLM {version}\n\nImported from {sdist.name}.\n\n{SHA_TRAILER}: {sha256}\n"
    commit = run_git(["commit-tree", tree], env=env, input=message.encode()).stdout
    commit_id = commit.decode().strip()
    run_git(["update-ref", f"refs/tags/{tag_for(version)}", commit_id], env=env)
    return commit_id


def ensure_upstream(config: Workspace, base: Base, fetcher: Fetcher | None = None) -> str:
    """Make sure ``upstream/<V>`` exists in the cache for the pinned sdist; return the tag."""
    repo = config.upstream_repo
    tag = tag_for(base.version)
    with cache_lock(config.cache_dir):
        if imported_sha256(repo, base.version) == base.sdist.sha256:
            return tag
        fetcher = fetcher or config.fetcher
        sdist = fetcher.ensure(base.sdist)
        init_repo(repo)
        config.tmp_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"import-{base.version}-", dir=config.tmp_dir))
        try:
            import_sdist(repo, base.version, sdist, base.sdist.sha256, work)
            # Pack the new loose objects so that clones hardlink a few files, not thousands.
            run_git(["--git-dir", repo, "repack", "-d", "-q", "--window=0"])
        except GitError:
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return tag
