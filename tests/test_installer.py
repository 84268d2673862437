"""uv makes and fills the venvs, pip where uv is absent; both from the same indexes."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_fork.cache import LAST_USED
from vllm_fork.sources import installer as inst
from vllm_fork.sources.installer import IndexConfig, InstallerError, index_config
from vllm_fork.sources.pipconf import PYPI_SIMPLE
from vllm_fork.wheel.wheelfile import record_digest

PIP_FILES = """\
global.index-url='https://files.example/simple'
global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'
global.find-links='/opt/wheels'
global.constraint='/etc/pip-constraints.txt'
install.trusted-host='files.example'
download.index-url='https://download-only.example/simple'
"""


def test_pip_files_are_read_for_install_not_download() -> None:
    conf = index_config({}, PIP_FILES)
    assert conf.index_url == "https://files.example/simple"
    assert conf.extra_index_urls == ("file:///opt/a/simple", "file:///opt/b/simple")
    assert conf.find_links == ("/opt/wheels",)
    assert conf.constraints == ("/etc/pip-constraints.txt",)
    assert conf.trusted_hosts == ("files.example",)


def test_variables_beat_files_and_uv_beats_pip() -> None:
    env = {"PIP_INDEX_URL": "https://pip-env.example/simple"}
    assert index_config(env, PIP_FILES).index_url == "https://pip-env.example/simple"
    env["UV_INDEX_URL"] = "https://uv-env.example/simple"
    assert index_config(env, PIP_FILES).index_url == "https://uv-env.example/simple"
    env["UV_DEFAULT_INDEX"] = "https://uv-default.example/simple"
    conf = index_config(
        {
            **env,
            "UV_EXTRA_INDEX_URL": "https://x.example/simple",
            "UV_INDEX": "named=https://n.example/simple https://files.example/simple",
            "UV_FIND_LINKS": "/more/wheels",
            "UV_CONSTRAINT": "/c.txt",
        },
        PIP_FILES,
    )
    assert conf.index_url == "https://uv-default.example/simple"
    # every other index, once, in order: pip's, then uv's
    assert conf.extra_index_urls == (
        "file:///opt/a/simple",
        "file:///opt/b/simple",
        "https://n.example/simple",
        "https://files.example/simple",
        "https://x.example/simple",
    )
    assert conf.find_links == ("/opt/wheels", "/more/wheels")
    assert conf.constraints == ("/etc/pip-constraints.txt", "/c.txt")


def test_nothing_configured_is_pypi_alone() -> None:
    assert index_config({}, "") == IndexConfig(index_url=PYPI_SIMPLE)
    assert index_config({"UV_NO_INDEX": "1"}, "").no_index
    assert index_config({"PIP_NO_INDEX": "yes"}, "").no_index


def test_both_installers_are_told_the_same() -> None:
    conf = IndexConfig(
        index_url="https://i.example/simple",
        extra_index_urls=("https://e.example/simple",),
        find_links=("/w",),
        constraints=("/c.txt",),
        trusted_hosts=("i.example",),
        cert="/ca.pem",
        proxy="http://proxy.example:3128",
        timeout=180.0,
    )
    pip, uv = conf.pip_args(), conf.uv_args()
    for args in (pip, uv):
        assert args[args.index("--index-url") + 1] == "https://i.example/simple"
        assert args[args.index("--extra-index-url") + 1] == "https://e.example/simple"
        assert args[args.index("--find-links") + 1] == "/w"
        assert args[args.index("--constraint") + 1] == "/c.txt"
    assert pip[pip.index("--trusted-host") + 1] == "i.example"
    assert uv[uv.index("--allow-insecure-host") + 1] == "i.example"
    # uv as pip searches: the best version of every index, uv's own files unread
    assert "--no-config" in uv and uv[uv.index("--index-strategy") + 1] == "unsafe-best-match"
    env = conf.uv_env({"UV_INDEX_URL": "https://gone.example/simple", "PATH": "/bin"})
    assert "UV_INDEX_URL" not in env and env["PATH"] == "/bin"
    assert env["SSL_CERT_FILE"] == "/ca.pem" and env["HTTPS_PROXY"] == "http://proxy.example:3128"
    assert env["UV_HTTP_TIMEOUT"] == "180"


def test_the_choice_of_installer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_uv = tmp_path / "bin" / "uv"
    fake_uv.parent.mkdir()
    fake_uv.write_text("#!/bin/sh\n")
    fake_uv.chmod(0o755)
    # not beside this interpreter: only PATH decides
    monkeypatch.setattr(inst.sys, "executable", str(tmp_path / "py" / "python"))
    path = {"PATH": str(fake_uv.parent)}
    assert inst.find_uv(path) == str(fake_uv)
    assert inst.find_uv({**path, inst.ENV_INSTALLER: "pip"}) is None
    # uv absent: pip, unless uv was asked for
    assert inst.find_uv({"PATH": str(tmp_path / "py")}) is None
    with pytest.raises(InstallerError, match="VLLM_FORK_INSTALLER=uv, but no uv"):
        inst.find_uv({"PATH": str(tmp_path / "py"), inst.ENV_INSTALLER: "uv"})
    with pytest.raises(InstallerError, match="expected one of auto, uv, pip"):
        inst.find_uv({inst.ENV_INSTALLER: "conda"})


# -- for real: a venv made and filled from a local index by each installer --------


def _wheel(directory: Path, version: str) -> Path:
    """The pure wheel of ``fork-probe`` (module ``fork_probe``)."""
    dist = f"fork_probe-{version}.dist-info"
    members = {
        "fork_probe.py": f"VERSION = {version!r}\n".encode(),
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: fork-probe\nVersion: {version}\n".encode()
        ),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(f"{m},{record_digest(d)},{len(d)}\n" for m, d in members.items())
    members[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    path = directory / f"fork_probe-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
    return path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """A PEP 503 index on 127.0.0.1 holding ``fork-probe`` 1.0 and 1.1."""
    root = tmp_path / "index"
    page = root / "simple" / "fork-probe"
    page.mkdir(parents=True)
    wheels = [_wheel(root, v).name for v in ("1.0", "1.1")]
    (page / "index.html").write_text("".join(f'<a href="../../{w}">{w}</a>\n' for w in wheels))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


def _uv() -> str | None:
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.is_file() else shutil.which("uv")


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_venv_is_filled_from_the_configured_index(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installer: str
) -> None:
    """The package exists on the local index only: each installer finds it there,
    whether pip's variable or uv's names the index."""
    if installer == "uv" and _uv() is None:
        pytest.skip("uv is not installed (the dev extras install it)")
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT", *inst._UV_INDEX_VARS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv(inst.ENV_INSTALLER, installer)
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"

    def installed() -> str:
        code = "import fork_probe; print(fork_probe.VERSION)"
        return subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()

    monkeypatch.setenv("PIP_INDEX_URL", served)
    tool = inst.installer()
    assert tool.name == installer and tool.indexes.index_url == served
    tool.create(venv, sys.executable, pip=installer == "pip")
    tool.install(python, ["fork-probe==1.0"])
    assert installed() == "1.0"
    # uv's variable names the index, pip's a port where nothing listens
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("UV_INDEX_URL", served)
    tool = inst.installer()
    tool.install(python, ["fork-probe==1.1"])
    assert installed() == "1.1"
    # not on the index: the installer's failure, its last lines kept
    with pytest.raises(InstallerError, match=f"{installer} install fork-probe==2.0 failed"):
        tool.install(python, ["fork-probe==2.0"])


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_tree_venvs_per_requirements_with_uv_one_per_torch_with_pip(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installer: str
) -> None:
    """uv: a base whose requirements differ gets a venv of its own, made from uv's
    cache; the least recently used beyond KEEP go. pip: the one venv of the torch
    spec is installed again (what pip runs is faked here: the test above runs it).
    fork-probe stands in for torch."""
    if installer == "uv" and _uv() is None:
        pytest.skip("uv is not installed (the dev extras install it)")
    installs: list[tuple[str, ...]] = []
    if installer == "pip":

        def create(self: inst.Installer, where: Path, *a: object, **k: object) -> None:
            (where / "bin").mkdir(parents=True)
            (where / "bin" / "python").touch()

        monkeypatch.setattr(inst.Installer, "create", create)
        monkeypatch.setattr(
            inst.Installer, "install", lambda self, python, args: installs.append(tuple(args))
        )
    from vllm_fork.sources.workspace import Workspace
    from vllm_fork.testing import treevenv

    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT", *inst._UV_INDEX_VARS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", served)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv(inst.ENV_INSTALLER, installer)
    monkeypatch.setattr(treevenv, "TEST_TOOLS", ())
    monkeypatch.setattr(treevenv, "KEEP", 2)
    monkeypatch.setattr(treevenv, "UNUSED_S", -1)
    config = Workspace(root=tmp_path, cache_dir=tmp_path / "cache")
    spec = "fork-probe==1.0"

    def tree(name: str, requirements: str) -> Path:
        reqs = tmp_path / name / "requirements" / "common.txt"
        reqs.parent.mkdir(parents=True)
        reqs.write_text(requirements)
        return tmp_path / name

    a, b, c = tree("a", "# base a\n"), tree("b", "# base b\n"), tree("c", "# base c\n")
    first = treevenv.ensure_tree_venv(config, a, spec)
    assert treevenv.ensure_tree_venv(config, a, spec) == first  # unchanged: as it is
    second = treevenv.ensure_tree_venv(config, b, spec)
    for python in (first, second):
        assert python.parent.parent.parent == config.cache.tree_venvs
    if installer == "pip":
        assert second == first == treevenv.venv_dir(config, spec) / "bin" / "python"
        assert [args[0] for args in installs] == [spec, "-r", spec, "-r"]
        return
    assert second != first and first.exists()
    assert {first.parent.parent.name, second.parent.parent.name} == {
        treevenv.venv_dir(config, spec, treevenv._wanted(t, spec)).name for t in (a, b)
    }
    # a third set of requirements: the least recently used (a's) goes
    os.utime(first.parent.parent / LAST_USED, (1, 1))
    third = treevenv.ensure_tree_venv(config, c, spec)
    assert third.exists() and second.exists() and not first.exists()


def test_a_given_tree_python_is_used_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_fork.sources.workspace import Workspace
    from vllm_fork.testing import treevenv

    config = Workspace(root=tmp_path, cache_dir=tmp_path / "cache")
    monkeypatch.setenv(treevenv.ENV_TREE_PYTHON, sys.executable)
    assert treevenv.ensure_tree_venv(config, tmp_path / "no-tree") == Path(sys.executable)
    assert not (tmp_path / "cache").exists()  # nothing made
    monkeypatch.setenv(treevenv.ENV_TREE_PYTHON, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(treevenv.TreeVenvError, match="VLLM_FORK_TREE_PYTHON=.*no such interpreter"):
        treevenv.ensure_tree_venv(config, tmp_path / "no-tree")
