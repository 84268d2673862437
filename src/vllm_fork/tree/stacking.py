"""Put upstream release V2 on top of upstream V1 in a work tree.

The cached repository holds each release as a parentless commit. For a
rebase, git must see V1 -> V2 as one diff (so that merges follow files
upstream moved), so the tree of ``upstream/V2`` is committed again with the
work tree's ``upstream/V1`` as parent, with the author, dates and message
of the cached import: the same inputs always give the same commit id.
"""

from __future__ import annotations

from pathlib import Path

from vllm_fork.facts.names import commit_identity, tag_for
from vllm_fork.git import git_env, git_out, run_git
from vllm_fork.lock import cache_lock
from vllm_fork.sources.workspace import Workspace

IMPORT_REF_PREFIX = "refs/vllm-fork/import/"


def import_ref(version: str) -> str:
    return f"{IMPORT_REF_PREFIX}{version}"


def _message(tree: Path, commit: str) -> bytes:
    raw = run_git(["cat-file", "commit", commit], cwd=tree).stdout
    _, sep, message = raw.partition(b"\n\n")
    return message if sep else b""


def stack_upstream(config: Workspace, tree: Path, version: str, parent: str) -> str:
    """Commit upstream ``version``'s tree onto ``parent`` in ``tree``; return the commit id.

    The objects come from the cache by a local fetch (only those the work
    tree lacks travel). The temporary ref used for the fetch is removed.
    """
    ref = import_ref(version)
    env = git_env(isolated=True)
    with cache_lock(config.cache_dir):
        run_git(
            [
                "fetch",
                "-q",
                "--no-tags",
                "--no-write-fetch-head",
                config.upstream_repo,
                f"+refs/tags/{tag_for(version)}:{ref}",
            ],
            cwd=tree,
            env=env,
        )
    source = git_out(["rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=tree)
    fields = git_out(
        ["log", "-1", "--date=raw", "--format=%an%x00%ae%x00%ad%x00%cn%x00%ce%x00%cd", source],
        cwd=tree,
    ).split("\0")
    an, ae, ad, cn, ce, cd = fields
    commit_env = git_env(
        commit_identity((cn, ce), author=(an, ae), author_date=ad, committer_date=cd),
        isolated=True,
    )
    commit = (
        run_git(
            ["commit-tree", f"{source}^{{tree}}", "-p", parent],
            cwd=tree,
            env=commit_env,
            input=_message(tree, source),
        )
        .stdout.decode()
        .strip()
    )
    run_git(["update-ref", "-d", ref], cwd=tree)
    return commit
