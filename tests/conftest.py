"""Shared fixtures: a local package index, synthetic bases, real upstream sources."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_fork.probes import GitTree
from vllm_fork.sources.pins import Base, FilePin, Pins, save_pins
from vllm_fork.sources.pipconf import PipConfig
from vllm_fork.sources.upstream import ensure_upstream
from vllm_fork.sources.workspace import Workspace, load_config
from vllm_fork.testing import toolsuite

FAKE_VERSION = "9.9.9"
FAKE_FILES = {
    "PKG-INFO": "Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n",
    "setup.py": "from setuptools import setup\n\nsetup()\n",
    "vllm/__init__.py": '__version__ = "9.9.9"\n',
    "vllm/layer.py": "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(12)),
    "csrc/kernel.cu": "// kernel\nint main() { return 0; }\n",
}
PKG_INFO_MTIME = 1_700_000_000


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    """Write a tar.gz from (member, data) pairs; data is None for non-files."""
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def file_member(name: str, data: bytes, mode: int = 0o644, mtime: int = 1_600_000_000):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = mtime
    info.uid = info.gid = 4242
    info.uname = info.gname = "someone"
    return info, data


def make_sdist(
    directory: Path, version: str = FAKE_VERSION, files: dict[str, str] | None = None
) -> Path:
    top = f"vllm-{version}"
    members = []
    for rel, text in sorted((files or FAKE_FILES).items()):
        mtime = PKG_INFO_MTIME if rel == "PKG-INFO" else 1_600_000_000
        members.append(file_member(f"{top}/{rel}", text.encode(), mtime=mtime))
    return make_tar(directory / f"{top}.tar.gz", members)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The release tests (marker ``release``) run in `vllm-fork release-check`
    (VLLM_FORK_RELEASE_TESTS=1); any other run skips them and says where they run."""
    if toolsuite.enabled():
        return
    # a skipif on the test itself: pytest reports it before a module's own skipif
    skip = pytest.mark.skipif(
        True,
        reason=f"release test: `vllm-fork release-check` runs it ({toolsuite.ENV}=1 runs it here)",
    )
    for item in items:
        if item.get_closest_marker(toolsuite.MARKER) is not None:
            item.add_marker(skip, append=False)


@pytest.fixture(autouse=True)
def _fresh_machine_git(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test sees git as on a fresh machine: no global or system
    configuration, hence no identity. The tests give their own commits one
    (tests/gitutil.py IDENTITY); the tool must never need the user's."""
    empty = tmp_path_factory.getbasetemp() / "empty.gitconfig"
    empty.touch()
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in (
        "GIT_AUTHOR_NAME",
        "GIT_AUTHOR_EMAIL",
        "GIT_COMMITTER_NAME",
        "GIT_COMMITTER_EMAIL",
    ):
        monkeypatch.delenv(name, raising=False)


@dataclass
class LocalIndex:
    """A PEP 503 index served from 127.0.0.1 by this test process."""

    root: Path
    url: str
    server: http.server.ThreadingHTTPServer
    requests: list[str]

    def publish(self, *files: Path, digest: str | None = None) -> None:
        """Serve ``files`` (copied in) on the index page of ``vllm``."""
        store = self.root / "files"
        store.mkdir(exist_ok=True)
        for f in files:
            (store / f.name).write_bytes(f.read_bytes())
        links = []
        for f in sorted(store.iterdir()):
            links.append(
                f'<a href="../../files/{f.name}#sha256={digest or sha256_of(f)}">{f.name}</a><br/>'
            )
        page = self.root / "simple" / "vllm"
        page.mkdir(parents=True, exist_ok=True)
        (page / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def local_index(tmp_path: Path) -> Iterator[LocalIndex]:
    root = tmp_path / "index"
    root.mkdir()
    seen: list[str] = []

    class Handler(_QuietHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            super().do_GET()

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    index = LocalIndex(root, f"http://127.0.0.1:{server.server_address[1]}/simple/", server, seen)
    try:
        yield index
    finally:
        if thread.is_alive():
            index.stop()


@dataclass
class ForkRepo:
    """A throw-away fork repository (bases.toml + series/) with its own cache."""

    root: Path
    config: Workspace
    sdist: Path

    def series_dir(self, version: str = FAKE_VERSION) -> Path:
        return self.config.series_dir(version)


@pytest.fixture
def fork_repo(tmp_path: Path, local_index: LocalIndex, monkeypatch: pytest.MonkeyPatch) -> ForkRepo:
    """A repository pinning a synthetic vLLM 9.9.9 served by ``local_index``."""
    root = tmp_path / "repo"
    (root / "series").mkdir(parents=True)
    build = tmp_path / "build"
    build.mkdir()
    sdist = make_sdist(build)
    local_index.publish(sdist)
    pins = Pins(
        default=FAKE_VERSION,
        bases={
            FAKE_VERSION: Base(FAKE_VERSION, FilePin(sdist.name, sha256_of(sdist)), supported=True)
        },
    )
    save_pins(root / "bases.toml", pins)
    cache = tmp_path / "cache"
    # Only the local index: no pip configuration files, no other index.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", local_index.url)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("VLLM_FORK_OFFLINE", raising=False)
    monkeypatch.setenv("VLLM_FORK_ROOT", str(root))
    monkeypatch.setenv("VLLM_FORK_CACHE_DIR", str(cache))
    # Reading pip's configuration costs a pip start-up per call; test_pipconf covers it.
    monkeypatch.setattr(
        "vllm_fork.sources.fetch.load_pip_config", lambda: PipConfig(index_url=local_index.url)
    )
    return ForkRepo(root, load_config(), sdist)


@pytest.fixture(scope="session")
def upstream_source() -> Callable[[str], GitTree]:
    """``upstream_source(version)``: the pristine upstream tree of a pinned base.

    Fetched (sha256-verified) and imported through the tool, using the user's
    download cache; tests using it need the index or a warm cache (mark them
    ``network``).
    """
    repo_root = Path(__file__).resolve().parents[1]
    config = load_config(root=repo_root)

    @functools.cache
    def get(version: str) -> GitTree:
        from vllm_fork.sources.pins import load_pins

        base = load_pins(config.bases_file).get(version)
        return GitTree(config.upstream_repo, ensure_upstream(config, base))

    return get


@pytest.fixture(scope="session")
def default_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real precompiled build of the default base per test session (with its
    release files beside it), shared by the end-to-end tests that need the wheel.
    Only the release tests enabled with VLLM_FORK_E2E_BUILD=1 ask for it."""
    import time

    from vllm_fork.deploy.release_files import release_files
    from vllm_fork.wheel.builder import BuildRequest, build

    config = load_config(root=Path(__file__).resolve().parents[1])
    t0 = time.monotonic()
    result = build(
        config, BuildRequest(mode="precompiled", out_dir=tmp_path_factory.mktemp("default"))
    )
    release_files(config, result)
    print(
        f"\nprecompiled build of the default base (online): {time.monotonic() - t0:.0f} s "
        f"(vLLM's build step {result.build_seconds:.0f} s)"
    )
    return result.wheel
