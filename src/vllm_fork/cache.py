"""The layout of the download cache: every path under it is named here, once.

::

    <cache>/                  $VLLM_FORK_CACHE_DIR, else the user cache dir
      .lock                   the cache lock (vllm_fork.lock)
      dist/                   verified downloads: sdists and upstream wheels
      upstream.git/           bare repository: one commit and tag per imported release
      tmp/                    staging of downloads and imports; only written while
                              holding the lock, so the lock empties it of what a
                              killed run left
      work/                   build trees and smoke venvs while in use (not under
                              tmp/: other runs take the lock meanwhile)
      build-env/<key>/        one build environment per (requirements, Python)
        .vllm-fork-ready      written last: the environment is complete
        .vllm-fork-used       touched by every command that uses it (`cache prune`)
      build-env/.lock         the lock of the build environments
      tree-venvs/<spec>/      the test venvs of vLLM work trees, one per torch spec
        .vllm-fork-used       touched by every command that uses it
      release-check/          `release-check`: one state file per base, its wheels
      backport/<key>/         one `backport` run's resumable state (state.json,
                              stage/, source.git)
      watch/<name>.git        bare clones `watch` makes of a URL it is given
      matrix/<V>-<key>.json   cached rows of `vllm-fork matrix`
      probes/<V>-<key>.json   the probes' findings on pristine upstream <V> (status)
      state/upstream.json     what upstream.git's imports were made from
      state/dist/<file>.sha256  the sha256 a download had when verified
      locks/<key>.lock        one lock per work-tree directory being made

A lock file holds the pid and command line of the run holding it (lock.py).
The tool's own work trees under work/ record the pid of the run that made
them in their git configuration (:data:`TREE_PID_KEY`), so `vllm-fork cache
prune` tells a killed run's tree from a running one's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir

ENV_CACHE = "VLLM_FORK_CACHE_DIR"
LOCK_FILE = ".lock"
TMP_DIR = "tmp"
BUILD_ENV_READY = ".vllm-fork-ready"
# touched each time a build environment or tree venv is used: what "unused for N
# days" of `vllm-fork cache prune` reads
LAST_USED = ".vllm-fork-used"
# git configuration key of a work tree under work/: the pid of the run that made it
TREE_PID_KEY = "vllm-fork.pid"


def default_cache_dir() -> Path:
    """``$VLLM_FORK_CACHE_DIR``, else the platform's user cache directory."""
    env_cache = os.environ.get(ENV_CACHE)
    if env_cache:
        return Path(env_cache).expanduser().resolve()
    return Path(user_cache_dir("vllm-fork"))


def lock_file(directory: Path) -> Path:
    """The lock file of a locked directory (the cache, or the build environments)."""
    return directory / LOCK_FILE


def staging_dir(directory: Path) -> Path:
    """Where a locked directory stages files; emptied when its lock is first taken."""
    return directory / TMP_DIR


@dataclass(frozen=True)
class CacheLayout:
    """The paths of one cache directory."""

    root: Path

    @property
    def lock(self) -> Path:
        return lock_file(self.root)

    @property
    def downloads(self) -> Path:
        return self.root / "dist"

    @property
    def upstream_git(self) -> Path:
        return self.root / "upstream.git"

    @property
    def tmp(self) -> Path:
        return staging_dir(self.root)

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def build_envs(self) -> Path:
        return self.root / "build-env"

    def build_env(self, key: str) -> Path:
        return self.build_envs / key

    def build_env_python(self, key: str) -> Path:
        return self.build_env(key) / "bin" / "python"

    @property
    def matrix_rows(self) -> Path:
        return self.root / "matrix"

    def matrix_row(self, version: str, key: str) -> Path:
        return self.matrix_rows / f"{version}-{key[:24]}.json"

    @property
    def release_check(self) -> Path:
        """``release-check``: one state file per base, the wheels it built."""
        return self.root / "release-check"

    @property
    def tree_venvs(self) -> Path:
        """The test venvs of vLLM work trees, one per torch spec."""
        return self.root / "tree-venvs"

    @property
    def probes(self) -> Path:
        return self.root / "probes"

    def probe_findings(self, version: str, key: str) -> Path:
        return self.probes / f"{version}-{key[:24]}.json"

    @property
    def backport_runs(self) -> Path:
        """``backport``: one directory of resumable state per carried commit."""
        return self.root / "backport"

    def backport_run(self, key: str) -> Path:
        return self.backport_runs / key

    @property
    def watch_clones(self) -> Path:
        """``watch``: the bare clones of the repositories it is given as URLs."""
        return self.root / "watch"

    def watch_clone(self, name: str) -> Path:
        return self.watch_clones / f"{name}.git"

    @property
    def records(self) -> Path:
        return self.root / "state"

    @property
    def download_records(self) -> Path:
        return self.records / "dist"

    def download_record(self, filename: str) -> Path:
        return self.download_records / f"{filename}.sha256"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    @property
    def upstream_record(self) -> Path:
        return self.records / "upstream.json"

    def dir_lock(self, key: str) -> Path:
        return self.locks / f"{key}.lock"
