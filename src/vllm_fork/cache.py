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
      build-env/.lock         the lock of the build environments
      matrix/<V>-<key>.json   cached rows of `vllm-fork matrix`
      probes/<V>-<key>.json   the probes' findings on pristine upstream <V> (status)
      state/upstream.json     what upstream.git's imports were made from
      state/dist/<file>.sha256  the sha256 a download had when verified
      locks/<key>.lock        one lock per work-tree directory being made
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

    def probe_findings(self, version: str, key: str) -> Path:
        return self.root / "probes" / f"{version}-{key[:24]}.json"

    def download_record(self, filename: str) -> Path:
        return self.root / "state" / "dist" / f"{filename}.sha256"

    @property
    def upstream_record(self) -> Path:
        return self.root / "state" / "upstream.json"

    def dir_lock(self, key: str) -> Path:
        return self.root / "locks" / f"{key}.lock"
