"""The Python a vLLM work tree's tests run with: CPU torch, the tree's
``requirements/common.txt`` and the test tools.

Shared by every base and every checkout, in ``<cache>/tree-venvs/``. With uv
(:mod:`vllm_fork.sources.installer`): one venv per set of requirements,
``<torch spec>-<digest>``, so bases with the same requirements share one and a
base whose requirements differ in a few lines gets its own, made from uv's cache
(hard links: seconds, torch is not installed again); the least recently used
beyond :data:`KEEP` are removed. With pip (uv absent): one venv per torch spec,
``<torch spec>``, installed again incrementally when the requirements differ
from what it last installed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from vllm_fork.cache import LAST_USED
from vllm_fork.config import torch_spec
from vllm_fork.errors import ForkError
from vllm_fork.hashing import sha256_bytes
from vllm_fork.lock import dir_lock
from vllm_fork.sources.installer import Installer, InstallerError, installer
from vllm_fork.sources.workspace import Workspace

log = logging.getLogger(__name__)

TEST_TOOLS = ("pytest", "hypothesis", "tblib")
# an interpreter to run the trees' tests with instead of a tree venv (nothing is
# installed into it: it must have pytest and what the trees' tests import)
ENV_TREE_PYTHON = "VLLM_FORK_TREE_PYTHON"
STAMP = ".vllm-fork-tree-installed"
# the per-requirements venvs (uv) kept per torch spec: one per distinct set of
# requirements among the bases in use (20 bases have fewer)
KEEP = 12
UNUSED_S = 3600


class TreeVenvError(ForkError):
    """The tree venv could not be created or installed."""


def venv_dir(config: Workspace, spec: str, digest: str | None = None) -> Path:
    """The venv of ``spec`` (pip), or of ``spec`` and the requirements ``digest`` (uv)."""
    key = re.sub(r"[^A-Za-z0-9.+-]+", "-", spec).strip("-")
    return config.cache.tree_venvs / (f"{key}-{digest[:12]}" if digest else key)


def _wanted(tree: Path, spec: str) -> str:
    reqs = tree / "requirements" / "common.txt"
    if not reqs.is_file():
        raise TreeVenvError(f"{tree} has no requirements/common.txt (is it a vLLM tree?)")
    text = reqs.read_bytes() + f"\0torch={spec}\0{' '.join(TEST_TOOLS)}".encode()
    return sha256_bytes(text)


def _install(tool: Installer, python: Path, *args: str) -> None:
    log.info("tree venv: %s install %s", tool.name, " ".join(args))
    try:
        tool.install(python, args)
    except InstallerError as exc:
        raise TreeVenvError(str(exc)) from None


# a requirement no version on the index satisfies, as pip and uv say it
_NO_MATCH = re.compile(
    r"No matching distribution found for ([A-Za-z0-9._-]+)"
    r"|Because (?:only |there is no version of )([A-Za-z0-9_.-]+?)(?:[<>=!~ ]|$)",
    re.MULTILINE,
)
MAX_RELAXED = 10


def _install_requirements(tool: Installer, python: Path, reqs: Path) -> None:
    """``pip install -r reqs`` plus the test tools. A requirement the index
    cannot satisfy (a tree newer than the index's snapshot, e.g. certifi of a
    later date) is relaxed to its newest available version, with a warning:
    the fork tests run on CPU and do not depend on such lower bounds."""
    lines = reqs.read_text().splitlines()
    relaxed: list[str] = []
    for _ in range(MAX_RELAXED):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=reqs.parent) as fh:
            fh.write("\n".join(lines) + "\n")
            fh.flush()
            try:
                _install(tool, python, "-r", fh.name, *TEST_TOOLS)
                break
            except TreeVenvError as exc:
                match = _NO_MATCH.search(str(exc))
                if match is None:
                    raise
                name = (match.group(1) or match.group(2)).lower()
        changed = False
        for i, line in enumerate(lines):
            try:
                req = Requirement(line.split("#", 1)[0].strip())
            except InvalidRequirement:
                continue
            if req.name.lower() == name and req.specifier:
                marker = f"; {req.marker}" if req.marker else ""
                lines[i] = f"{req.name}{marker}"
                relaxed.append(f"{req.name}{req.specifier}")
                changed = True
        if not changed:
            raise TreeVenvError(f"no version of {name} on the index satisfies {reqs}")
        log.warning("tree venv: %s is not on the index; installing its newest version", name)
    else:
        raise TreeVenvError(f"too many requirements of {reqs} are not on the index")
    if relaxed:
        log.warning("tree venv: relaxed %s", ", ".join(relaxed))


def ensure_tree_venv(config: Workspace, tree: Path, spec: str | None = None) -> Path:
    """The interpreter of the tree venv for ``spec``, installed for ``tree`` (or
    ``$VLLM_FORK_TREE_PYTHON`` as it is)."""
    given = os.environ.get(ENV_TREE_PYTHON)
    if given:
        if not os.access(given, os.X_OK) or Path(given).is_dir():
            raise TreeVenvError(f"{ENV_TREE_PYTHON}={given}: no such interpreter")
        return Path(given)
    spec = torch_spec(spec)
    tool = installer()
    want = _wanted(tree, spec)
    where = venv_dir(config, spec, want if tool.uv else None)
    python = where / "bin" / "python"
    with dir_lock(config.cache_dir, where):
        stamp = where / STAMP
        if python.exists() and stamp.is_file() and stamp.read_text().strip() == want:
            # the one record of its use: `_prune` and `vllm-fork cache prune` read it
            (where / LAST_USED).touch()
            return python
        if config.offline:
            log.info("offline: the installer reads only local indexes and wheel directories")
        if not python.exists():
            log.info("creating the tree venv %s (%s)", where, tool.name)
            where.parent.mkdir(parents=True, exist_ok=True)
            try:
                tool.create(where, sys.executable, pip=not tool.uv)
            except InstallerError as exc:
                raise TreeVenvError(str(exc)) from None
        stamp.unlink(missing_ok=True)  # a killed install is redone, never trusted
        _install(tool, python, spec)
        _install_requirements(tool, python, tree / "requirements" / "common.txt")
        stamp.write_text(want + "\n")
        (where / LAST_USED).touch()
    if tool.uv:
        _prune(config, spec, keep=where)
    return python


def _prune(config: Workspace, spec: str, keep: Path) -> None:
    """Remove the per-requirements venvs of ``spec`` beyond the :data:`KEEP` used last,
    and only those unused for an hour (a run in progress touched its venv's
    :data:`~vllm_fork.cache.LAST_USED` when it started; never ``keep``)."""
    prefix = venv_dir(config, spec).name + "-"
    found = []
    for path in config.cache.tree_venvs.glob(prefix + "*"):
        stamp, marker = path / STAMP, path / LAST_USED
        if path != keep and stamp.is_file() and len(path.name) == len(prefix) + 12:
            found.append(((marker if marker.is_file() else stamp).stat().st_mtime, path))
    found.sort(reverse=True)
    for used, path in found[max(KEEP - 1, 0) :]:
        if time.time() - used > UNUSED_S:
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed the tree venv %s (one of more than %d)", path, KEEP)


if __name__ == "__main__":  # pragma: no cover - used by scripts/tree-venv.sh
    from vllm_fork.sources.workspace import load_config

    try:
        print(ensure_tree_venv(load_config(), Path(sys.argv[1]).resolve()))
    except ForkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
