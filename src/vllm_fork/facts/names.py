"""Names the tool gives what it makes: upstream's tags, and the identities of
the commits it writes (fixed, so that the same inputs give the same commit ids
whoever runs the tool; the user's git identity is never used)."""

from __future__ import annotations

UPSTREAM_TAG_PREFIX = "upstream/"

FORK_NAME = "vLLM ROCm fork maintainers"
FORK_EMAIL = "rocm-fork-maintainers@users.noreply.github.com"
UPSTREAM_NAME = "vLLM upstream"
UPSTREAM_EMAIL = "vllm-upstream@users.noreply.github.com"

Identity = tuple[str, str]  # (name, email)
FORK: Identity = (FORK_NAME, FORK_EMAIL)
UPSTREAM: Identity = (UPSTREAM_NAME, UPSTREAM_EMAIL)


def tag_for(version: str) -> str:
    """The tag of upstream's release ``version``: in the cached upstream git and in
    every work tree the tool makes."""
    return f"{UPSTREAM_TAG_PREFIX}{version}"


def commit_identity(
    committer: Identity = FORK,
    *,
    author: Identity | None = None,
    author_date: str | None = None,
    committer_date: str | None = None,
) -> dict[str, str]:
    """The git environment that gives a commit its committer (default: the fork's
    maintainers) and, when given, its author and dates."""
    env = {"GIT_COMMITTER_NAME": committer[0], "GIT_COMMITTER_EMAIL": committer[1]}
    if author is not None:
        env["GIT_AUTHOR_NAME"], env["GIT_AUTHOR_EMAIL"] = author
    if author_date is not None:
        env["GIT_AUTHOR_DATE"] = author_date
    if committer_date is not None:
        env["GIT_COMMITTER_DATE"] = committer_date
    return env
