"""Synthetic upstream releases and series for the rebase and matrix tests.

Each release is a tiny tree written as a fake sdist and imported into a
temporary cache with the tool's own import function, so ``ensure_upstream``
finds it and nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_fork.cache import CacheLayout
from vllm_fork.sources.pins import Base, FilePin, Pins, save_pins
from vllm_fork.sources.upstream import import_sdist, init_repo
from vllm_fork.sources.workspace import Workspace, load_config

try:
    from .gitutil import IDENTITY
    from .seriesutil import series_files
except ImportError:
    from gitutil import IDENTITY  # type: ignore[no-redef]
    from seriesutil import series_files  # type: ignore[no-redef]

DATE = "2026-11-21T12:00:00+00:00"


def numbered(prefix: str, count: int) -> list[str]:
    return [f"{prefix} line {i}" for i in range(1, count + 1)]


def text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def replace(lines: list[str], number: int, new: str) -> list[str]:
    """A copy of ``lines`` with line ``number`` (1-based) replaced."""
    out = list(lines)
    out[number - 1] = new
    return out


OPS = numbered("ops", 40)
KERNEL = numbered("kernel", 30)
MOE = numbered("moe", 30)
ROPE = numbered("rope", 30)
OTHER = numbered("other", 20)

# The base release.
V1_FILES = {
    "vllm/ops.py": text(OPS),
    "csrc/pos_encoding_kernels.cu": text(KERNEL),
    "vllm/moe.py": text(MOE),
    "vllm/rope.py": text(ROPE),
    "vllm/other.py": text(OTHER),
}
# The next release: the ops patch's lines moved down and their context changed, the kernel moved,
# the moe change absorbed verbatim, and the rope line the conflict patch edits changed.
V2_FILES = {
    "vllm/ops.py": text(
        numbered("ops header", 7) + replace(OPS, 18, "ops line 18 changed upstream")
    ),
    "csrc/libtorch_stable/pos_encoding_kernels.cu": text(KERNEL),
    "vllm/moe.py": text(replace(MOE, 5, "moe line 5 precast once")),
    "vllm/rope.py": text(replace(ROPE, 10, "rope line 10 upstream version")),
    "vllm/other.py": text(OTHER),
}


def sdist_bytes(version: str, files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    top = f"vllm-{version}"
    members = {"PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n", **files}
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, content in sorted(members.items()):
            data = content.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, **IDENTITY, **(env or {})}
    proc = subprocess.run(["git", *args], cwd=cwd, env=full, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


@dataclass
class PatchSpec:
    subject: str
    change: str
    part: str
    edits: dict[str, dict[int, str]]  # path -> {line number (1-based): new line}
    trailers: str = ""  # more trailer lines (e.g. "Fork-Fixes: ID\n")


def message(spec: PatchSpec) -> str:
    origin = (
        "backport, https://github.com/vllm-project/vllm/pull/1"
        if spec.part == "change"
        else "vendor"
    )
    return (
        f"{spec.subject}\n\nWhat the patch does, for the tests.\n\n"
        f"Fork-Change: {spec.change}\nFork-Part: {spec.part}\nOrigin: {origin}\n"
        f"Forwarded: no\n{spec.trailers}"
    )


V1, V2 = "1.0.0", "1.1.0"

OTHER = PatchSpec(
    "[Misc] Touch other",
    "rope-bf16-buffer",
    "change",
    {"vllm/other.py": {3: "other line 3 patched"}},
)
OPS = PatchSpec(
    "[ROCm] Edit ops next to an upstream edit",
    "ar-rms-pack-gate",
    "change",
    {"vllm/ops.py": {20: "ops line 20 patched"}},
)
KERNEL = PatchSpec(
    "[ROCm] Read the cache in its own dtype",
    "rope-cache-dtype",
    "change",
    {"csrc/pos_encoding_kernels.cu": {12: "kernel line 12 patched"}},
)
MOE = PatchSpec(
    "[ROCm] Precast the bias once",
    "moe-bias-precast",
    "change",
    {"vllm/moe.py": {5: "moe line 5 precast once"}},
)
MOE_HARDENING = PatchSpec(
    "[ROCm] Guard the precast bias",
    "moe-bias-precast",
    "hardening",
    {"vllm/moe.py": {25: "moe line 25 guarded"}},
)
ROPE = PatchSpec(
    "[ROCm] Change a rope line upstream also changed",
    "dsv32-decode",
    "change",
    {"vllm/rope.py": {10: "rope line 10 fork version"}},
)

KEEP_FORK = ("rope line 10", "rope line 10 upstream version")
KEEP_UPSTREAM = ("rope line 10", "rope line 10 fork version")

CLEAN_SERIES = [OTHER, OPS, KERNEL, MOE, MOE_HARDENING]
CONFLICT_SERIES = [OTHER, OPS, ROPE, KERNEL, MOE, MOE_HARDENING]


def edit_lines(path: Path, lines: dict[int, str]) -> None:
    """Replace lines of ``path``; a missing file is created with numbered lines first."""
    if path.exists():
        content = path.read_text().splitlines()
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        content = numbered(path.stem, max(lines))
    for number, new in lines.items():
        content[number - 1] = new
    path.write_text(text(content))


@dataclass
class Fork:
    root: Path
    config: Workspace
    tmp: Path

    def series_dir(self, version: str) -> Path:
        return self.config.series_dir(version)

    def write_series(self, version: str, patches: list[PatchSpec]) -> Path:
        """Make series/<version>/ with the tool: materialize, commit, export."""
        from vllm_fork.tree.export import export
        from vllm_fork.tree.materialize import materialize

        work = self.tmp / f"author-{version}"
        materialize(self.config, version, work)
        env = {"GIT_AUTHOR_DATE": DATE, "GIT_COMMITTER_DATE": DATE}
        for spec in patches:
            for path, lines in spec.edits.items():
                edit_lines(work / path, lines)
            git(work, "add", "-A")
            git(work, "commit", "-q", "-m", message(spec), env=env)
        export(self.config, work)
        return self.series_dir(version)


def make_fork(
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    releases: dict[str, dict[str, str]],
    default: str,
    supported: set[str] | None = None,
) -> Fork:
    root = tmp / "repo"
    (root / "series").mkdir(parents=True)
    cache = tmp / "cache"
    dist = tmp / "sdists"
    dist.mkdir()
    bases = {}
    repo = CacheLayout(cache).upstream_git
    init_repo(repo)
    for version, files in releases.items():
        sdist = dist / f"vllm-{version}.tar.gz"
        sdist.write_bytes(sdist_bytes(version, files))
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        work = tmp / f"import-{version}"
        work.mkdir()
        import_sdist(repo, version, sdist, digest, work)
        is_supported = supported is None or version in supported
        bases[version] = Base(version, FilePin(sdist.name, digest), supported=is_supported)
    save_pins(root / "bases.toml", Pins(default=default, bases=bases))
    monkeypatch.setenv("VLLM_FORK_ROOT", str(root))
    monkeypatch.setenv("VLLM_FORK_CACHE_DIR", str(cache))
    monkeypatch.setenv("VLLM_FORK_OFFLINE", "1")
    return Fork(root, load_config(), tmp)


MARKERS = ("<<<<<<<", "|||||||", "=======", ">>>>>>>")


def resolve(path: Path, drop: tuple[str, ...]) -> None:
    """Resolve a conflicted file by removing the markers and the lines in ``drop``."""
    lines = path.read_text().splitlines()
    path.write_text(text([ln for ln in lines if not ln.startswith(MARKERS) and ln not in drop]))


def snapshot(tree: Path) -> dict[str, str]:
    """Everything --abort must restore: refs, HEAD, index/work tree status, recorded base."""
    return {
        "refs": git(tree, "for-each-ref", "--format=%(refname) %(objectname)"),
        "head": git(tree, "rev-parse", "--symbolic-full-name", "HEAD")
        + " "
        + git(tree, "rev-parse", "HEAD"),
        "status": git(tree, "status", "--porcelain=v2", "--branch", "--untracked-files=all"),
        "base": git(tree, "config", "vllm-fork.base"),
        "files": git(tree, "ls-files", "-s"),
    }


__all__ = ["series_files"]
