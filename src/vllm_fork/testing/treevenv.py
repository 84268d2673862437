"""The Python a vLLM work tree's tests run with: CPU torch, the tree's
``requirements/common.txt`` and the test tools.

One venv per torch spec, shared by every base and every checkout:
``<cache>/tree-venvs/<torch spec>``. It is (re)installed only when the
spec or the tree's requirements differ from what it last installed, so
switching between bases with the same requirements costs nothing and a
different set costs one incremental ``pip install``.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from vllm_fork.cache import LAST_USED
from vllm_fork.config import torch_spec
from vllm_fork.errors import ForkError
from vllm_fork.hashing import sha256_bytes
from vllm_fork.lock import dir_lock
from vllm_fork.sources.workspace import Workspace

log = logging.getLogger(__name__)

TEST_TOOLS = ("pytest", "hypothesis", "tblib")
STAMP = ".vllm-fork-tree-installed"


class TreeVenvError(ForkError):
    """The tree venv could not be created or installed."""


def venv_dir(config: Workspace, spec: str) -> Path:
    key = re.sub(r"[^A-Za-z0-9.+-]+", "-", spec).strip("-")
    return config.cache.tree_venvs / key


def _wanted(tree: Path, spec: str) -> str:
    reqs = tree / "requirements" / "common.txt"
    if not reqs.is_file():
        raise TreeVenvError(f"{tree} has no requirements/common.txt (is it a vLLM tree?)")
    text = reqs.read_bytes() + f"\0torch={spec}\0{' '.join(TEST_TOOLS)}".encode()
    return sha256_bytes(text)


def _pip(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    log.info("tree venv: pip install %s", " ".join(args))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-15:])
        raise TreeVenvError(f"pip install {' '.join(args)} failed:\n{tail}")


_NO_MATCH = re.compile(r"No matching distribution found for ([A-Za-z0-9._-]+)")
MAX_RELAXED = 10


def _install_requirements(python: Path, reqs: Path) -> None:
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
                _pip(python, "-r", fh.name, *TEST_TOOLS)
                break
            except TreeVenvError as exc:
                match = _NO_MATCH.search(str(exc))
                if match is None:
                    raise
                name = match.group(1).lower()
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
    """The interpreter of the tree venv for ``spec``, installed for ``tree``."""
    spec = torch_spec(spec)
    where = venv_dir(config, spec)
    python = where / "bin" / "python"
    want = _wanted(tree, spec)
    with dir_lock(config.cache_dir, where):
        stamp = where / STAMP
        if python.exists() and stamp.is_file() and stamp.read_text().strip() == want:
            (where / LAST_USED).touch()  # `vllm-fork cache prune` keeps it
            return python
        if config.offline:
            log.info("offline: pip reads only local indexes and wheel directories")
        if not python.exists():
            log.info("creating the tree venv %s", where)
            where.parent.mkdir(parents=True, exist_ok=True)
            venv.EnvBuilder(with_pip=True).create(where)
        stamp.unlink(missing_ok=True)  # a killed install is redone, never trusted
        _pip(python, spec)
        _install_requirements(python, tree / "requirements" / "common.txt")
        stamp.write_text(want + "\n")
        (where / LAST_USED).touch()
    return python


if __name__ == "__main__":  # pragma: no cover - used by scripts/tree-venv.sh
    from vllm_fork.sources.workspace import load_config

    try:
        print(ensure_tree_venv(load_config(), Path(sys.argv[1]).resolve()))
    except ForkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
