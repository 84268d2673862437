"""The cached upstream repository: one deterministic root commit per pinned sdist.

``<cache>/upstream.git`` is a bare repository. Importing vLLM <V> unpacks the
verified sdist, records its tree as a parentless commit by a fixed author
dated from the sdist's PKG-INFO, and tags it ``upstream/<V>``. The commit
message carries the sdist's sha256, so an import is reused only for the
exact pinned file.

Each import is recorded outside the repository, in
``<cache>/state/upstream.json``: the sdist sha256, the commit and tree ids,
and the sha256 of every pack file. Every use checks the tag against the
record and the packs' bytes against their hashes (a few hundred ms); a
mismatch (a moved tag, a forged commit, a deleted or damaged pack) makes the
repository be rebuilt from the sha256-verified sdist. A changed pin is not
corruption: the new sdist is imported and the record updated.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
import zlib
from pathlib import Path
from typing import Any

from vllm_fork import faults
from vllm_fork.atomic import place_dir, write_json_atomic
from vllm_fork.config import ENV_CACHE
from vllm_fork.errors import CacheCorruptError, CacheError, ForkError, UnsafeArchiveError
from vllm_fork.facts.names import UPSTREAM, commit_identity, tag_for
from vllm_fork.git import git_env, git_out, ref_exists, run_git
from vllm_fork.hashing import sha256_file
from vllm_fork.lock import cache_lock, owned_tempdir
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pins import Base
from vllm_fork.sources.unpack import safe_extract
from vllm_fork.sources.workspace import Workspace

SHA_TRAILER = "Sdist-SHA256"

log = logging.getLogger(__name__)


def init_repo(repo: Path, tmp_dir: Path | None = None) -> None:
    """Create the bare repository, atomically: made in ``tmp_dir`` and renamed into place."""
    if (repo / "HEAD").is_file():
        return
    repo.parent.mkdir(parents=True, exist_ok=True)
    work = owned_tempdir(tmp_dir or repo.parent, "init")
    try:
        staged = work / "repo"
        run_git(["init", "-q", "--bare", staged])
        for key, value in (
            ("gc.auto", "0"),
            ("core.autocrlf", "false"),
            ("core.fileMode", "true"),
            ("core.precomposeUnicode", "false"),
        ):
            run_git(["--git-dir", staged, "config", key, value])
        faults.point("upstream.init")
        if repo.exists():
            # a directory without HEAD: left by an older tool; ours to replace
            shutil.rmtree(repo)
        place_dir(staged, repo)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _record_path(config: Workspace) -> Path:
    return config.cache.upstream_record


def _load_record(config: Workspace) -> dict[str, Any]:
    path = _record_path(config)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"packs": {}, "imports": {}}
    except (OSError, ValueError) as exc:
        log.warning("the import record %s is unreadable (%s); re-importing", path, exc)
        return {"packs": {}, "imports": {}}
    if not isinstance(data, dict):
        return {"packs": {}, "imports": {}}
    data.setdefault("packs", {})
    data.setdefault("imports", {})
    return data


def _save_record(config: Workspace, record: dict[str, Any]) -> None:
    write_json_atomic(_record_path(config), record, indent=1)


def _pack_files(repo: Path) -> list[Path]:
    pack_dir = repo / "objects" / "pack"
    return sorted(p for p in pack_dir.glob("pack-*") if p.suffix in {".pack", ".idx"})


def check_import(config: Workspace, version: str, record: dict[str, Any]) -> str | None:
    """What is wrong with the cached import of ``version`` (None: it matches its record)."""
    repo = config.upstream_repo
    entry = record["imports"].get(version)
    if entry is None:
        return None
    for name, digest in sorted(record["packs"].items()):
        path = repo / "objects" / "pack" / name
        if not path.is_file():
            return f"pack file {name} is missing"
        if sha256_file(path) != digest:
            return f"pack file {name} is damaged (its sha256 changed since it was written)"
    tag = tag_for(version)
    if not (repo / "HEAD").is_file():
        return f"{repo} is not a git repository any more"
    proc = run_git(
        ["--git-dir", repo, "rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}"],
        check=False,
    )
    commit = proc.stdout.decode().strip()
    if proc.returncode != 0 or not commit:
        return f"tag {tag} is missing or does not name a commit"
    if commit != entry["commit"]:
        return f"tag {tag} was moved to {commit[:12]}; the import made {entry['commit'][:12]}"
    proc = run_git(
        ["--git-dir", repo, "rev-parse", "-q", "--verify", f"{commit}^{{tree}}"], check=False
    )
    if proc.returncode != 0 or proc.stdout.decode().strip() != entry["tree"]:
        return f"commit {commit[:12]} does not have the imported tree {entry['tree'][:12]}"
    proc = run_git(["--git-dir", repo, "rev-list", "--objects", "--quiet", commit], check=False)
    if proc.returncode != 0:
        detail = (proc.stderr.decode().strip().splitlines() or ["git rev-list failed"])[-1]
        return f"objects of {tag} are missing ({detail})"
    return None


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
    try:
        with tarfile.open(sdist, "r:*") as tar:
            member = tar.getmember(f"{top}/PKG-INFO")
            return int(member.mtime)
    except KeyError:
        raise UnsafeArchiveError(f"{sdist.name} has no {top}/PKG-INFO") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise UnsafeArchiveError(f"cannot read {sdist.name}: {exc}") from exc


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
            **commit_identity(UPSTREAM, author=UPSTREAM, author_date=date, committer_date=date),
        },
        isolated=True,
    )
    # -f: files matched by .gitignore files inside the sdist are part of the release too.
    run_git(["add", "-A", "-f", "."], cwd=tree_dir, env=env)
    tree = git_out(["write-tree"], env=env)
    message = f"vLLM {version}\n\nImported from {sdist.name}.\n\n{SHA_TRAILER}: {sha256}\n"
    commit = run_git(["commit-tree", tree], env=env, input=message.encode()).stdout
    commit_id = commit.decode().strip()
    faults.point("upstream.commit")
    run_git(["update-ref", f"refs/tags/{tag_for(version)}", commit_id], env=env)
    return commit_id


def in_cache(config: Workspace, base: Base) -> bool:
    """Whether upstream ``base`` can be read with no download: imported into
    upstream.git from its pinned sdist, or that sdist is in the downloads."""
    return (
        imported_sha256(config.upstream_repo, base.version) == base.sdist.sha256
        or (config.dist_dir / base.sdist.filename).is_file()
    )


def not_cached_reason(version: str) -> str:
    """What a report says of a release it did not cover because it is not cached."""
    return (
        f"not in the cache: not covered (`--fetch` fetches it, or `vllm-fork fetch --base "
        f"{version}`)"
    )


def ensure_upstream(config: Workspace, base: Base, fetcher: Fetcher | None = None) -> str:
    """Make sure ``upstream/<V>`` exists in the cache for the pinned sdist; return the tag.

    The cached import is checked against its record on every call; see the
    module docstring for what happens on a mismatch.
    """
    tag = tag_for(base.version)
    # A reader whose release is imported and sound does not wait for the cache
    # lock (a download or import of another release may hold it for minutes):
    # the record is replaced atomically and an import is never changed in place.
    try:
        record = json.loads(_record_path(config).read_text())
        entry = record["imports"].get(base.version)
        if (
            entry is not None
            and entry["sdist_sha256"] == base.sdist.sha256
            and check_import(config, base.version, record) is None
        ):
            return tag
    except (ForkError, OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # decided under the lock below (which also reports what is wrong)
    try:
        with cache_lock(config.cache_dir):
            record = _load_record(config)
            entry = record["imports"].get(base.version)
            if entry is not None and entry["sdist_sha256"] != base.sdist.sha256:
                log.info(
                    "the pin of vLLM %s changed since it was imported (sdist sha256 %s, now %s); "
                    "importing the pinned sdist",
                    base.version,
                    entry["sdist_sha256"][:12],
                    base.sdist.sha256[:12],
                )
                entry = None
            elif entry is not None:
                problem = check_import(config, base.version, record)
                if problem is None:
                    return tag
                log.warning(
                    "the cached upstream git %s is corrupt: %s; rebuilding it from the "
                    "verified sdist",
                    config.upstream_repo,
                    problem,
                )
                _discard_repo(config)
                record = {"packs": {}, "imports": {}}
                _save_record(config, record)
            fetcher = fetcher or config.fetcher
            if (
                entry is None
                and config.offline
                and not fetcher.cached_path(base.sdist).is_file()
                and imported_sha256(config.upstream_repo, base.version) == base.sdist.sha256
            ):
                # An import made before imports were recorded, and no sdist to redo it
                # with: record it as found (the next online run cannot tell it apart).
                log.info(
                    "recording the existing import of vLLM %s (sdist not cached)", base.version
                )
                _record_import(
                    config,
                    base,
                    record,
                    git_out(
                        [
                            "--git-dir",
                            config.upstream_repo,
                            "rev-parse",
                            f"refs/tags/{tag}^{{commit}}",
                        ]
                    ),
                )
            else:
                _import(config, base, fetcher, record)
            problem = check_import(config, base.version, record)
            if problem is not None:
                raise CacheCorruptError(
                    f"the cached upstream git {config.upstream_repo} is still wrong after a "
                    f"rebuild: {problem}; remove {config.cache_dir} and rerun"
                )
    except OSError as exc:
        raise CacheError(
            f"cannot use the cache {config.cache_dir}: {exc.strerror or exc}"
            + (f" ({exc.filename})" if exc.filename else "")
            + f"; fix its permissions or set {ENV_CACHE} to a writable directory"
        ) from exc
    return tag


def _discard_repo(config: Workspace) -> None:
    repo = config.upstream_repo
    if not repo.exists():
        return
    trash = owned_tempdir(config.tmp_dir, "corrupt")
    os.rename(repo, trash / "repo")
    shutil.rmtree(trash, ignore_errors=True)


def _import(config: Workspace, base: Base, fetcher: Fetcher, record: dict[str, Any]) -> None:
    repo = config.upstream_repo
    sdist = fetcher.ensure(base.sdist)
    init_repo(repo, config.tmp_dir)
    work = owned_tempdir(config.tmp_dir, f"import-{base.version}")
    try:
        commit = import_sdist(repo, base.version, sdist, base.sdist.sha256, work)
        faults.point("upstream.tag")
        # Pack the new loose objects so that clones hardlink a few files, not thousands.
        run_git(["--git-dir", repo, "repack", "-d", "-q", "--window=0"])
        faults.point("upstream.repack")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _record_import(config, base, record, commit)


def _record_import(config: Workspace, base: Base, record: dict[str, Any], commit: str) -> None:
    repo = config.upstream_repo
    packs = {p.name: record["packs"].get(p.name) for p in _pack_files(repo)}
    record["packs"] = {
        name: digest or sha256_file(repo / "objects" / "pack" / name)
        for name, digest in packs.items()
    }
    tree = git_out(["--git-dir", repo, "rev-parse", f"{commit}^{{tree}}"])
    record["imports"][base.version] = {
        "sdist_sha256": base.sdist.sha256,
        "commit": commit,
        "tree": tree,
    }
    _save_record(config, record)
