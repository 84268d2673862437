"""`publish` against a real index server (pypiserver on 127.0.0.1), with small fork wheels.

The protocol part (refusal, upload, idempotent re-upload, a different file,
bad credentials, an unreachable index, installing from the index) runs on
synthetic fork wheels of a synthetic base; the real wheel of the default base
goes through the same path in test_deploy_e2e.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.deploy.publish import PublishError, publish
from vllm_fork.deploy.release_files import sidecar, write_release_files
from vllm_fork.deploy.sbom import SUFFIX as SBOM
from vllm_fork.wheel.provenance import PACKAGE_PATH
from vllm_fork.wheel.wheelfile import Wheel

from .buildutil import make_series, pin_upstream_wheel, python_patch
from .conftest import ForkRepo
from .indexserver import PASSWORD, USER, IndexServer, free_port, index_server
from .test_build_provenance import VERSION, fork_wheel, record_for

ENV = {"python": "3.11", "torch": "2.11.0"}


@pytest.fixture
def series_repo(fork_repo: ForkRepo, tmp_path: Path) -> ForkRepo:
    pin_upstream_wheel(fork_repo, tmp_path / "upstream")
    make_series(fork_repo, tmp_path, python_patch)
    return fork_repo


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[IndexServer]:
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)
    with index_server(tmp_path / "index") as srv:
        yield srv


def released(repo: ForkRepo, directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    record = record_for(repo)
    wheel = fork_wheel(directory, record, tree=repo.root.parent / "wt")
    write_release_files(wheel, record, ENV)
    return wheel


def test_publish_upload_and_idempotent(
    series_repo: ForkRepo, server: IndexServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = released(series_repo, tmp_path / "d")
    assert main(["publish", str(wheel), "--repository", server.url]) == 0
    assert capsys.readouterr().out == f"{wheel.name}: uploaded\n"
    assert (server.packages / wheel.name).read_bytes() == wheel.read_bytes()
    assert main(["publish", str(wheel), "--repository", server.url]) == 0
    assert capsys.readouterr().out == f"{wheel.name}: already there\n"


def test_publish_installs_from_the_index(
    series_repo: ForkRepo, server: IndexServer, tmp_path: Path
) -> None:
    wheel = released(series_repo, tmp_path / "d")
    publish(series_repo.config, [wheel], server.url)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    # the outer pip installs into the new venv's site-packages: no pip bootstrap needed
    site = next((venv / "lib").glob("python*/site-packages"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "-q"]
        + ["--target", site, "--index-url", server.simple, f"vllm=={VERSION}"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    # what pip took from the index is the published wheel (smoke's probes need real
    # vLLM sources: the real wheel goes through `smoke --installed` in test_deploy_e2e.py)
    installed = (site / PACKAGE_PATH).read_bytes()
    with Wheel(wheel) as w:
        assert installed == w.read(PACKAGE_PATH)
    assert (site / f"vllm-{VERSION}.dist-info" / "METADATA").is_file()


def test_publish_refuses_a_wheel_that_does_not_verify(
    series_repo: ForkRepo, server: IndexServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = released(series_repo, tmp_path / "d")
    sidecar(wheel, SBOM).unlink()
    assert main(["publish", str(wheel), "--repository", server.url]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"vllm-fork: error: refusing {wheel.name}: it does not verify (SBOM")
    assert not any(server.packages.iterdir())


def test_publish_refuses_a_different_file_of_the_same_name(
    series_repo: ForkRepo, server: IndexServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = released(series_repo, tmp_path / "a")
    publish(series_repo.config, [first], server.url)
    record = record_for(series_repo)
    (tmp_path / "b").mkdir()
    second = fork_wheel(tmp_path / "b", record, tree=series_repo.root.parent / "wt")
    with open(second, "ab") as fh:  # same name, other bytes (zip comment)
        fh.write(b"\0")
    write_release_files(second, record, ENV)
    with pytest.raises(PublishError, match="already has a different"):
        publish(series_repo.config, [second], server.url)
    assert (server.packages / first.name).read_bytes() == first.read_bytes()


def test_publish_index_without_sha256_digests(
    series_repo: ForkRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index that lists md5 only: the file there is downloaded and hashed."""
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)
    with index_server(tmp_path / "index", hash_algo="md5") as srv:
        first = released(series_repo, tmp_path / "a")
        assert [d.action for d in publish(series_repo.config, [first], srv.url)] == ["uploaded"]
        again = publish(series_repo.config, [first], srv.url)
        assert [d.action for d in again] == ["already there"]
        (tmp_path / "b").mkdir()
        second = fork_wheel(
            tmp_path / "b", record_for(series_repo), tree=series_repo.root.parent / "wt"
        )
        with open(second, "ab") as fh:
            fh.write(b"\0")
        write_release_files(second, record_for(series_repo), ENV)
        with pytest.raises(PublishError, match="already has a different"):
            publish(series_repo.config, [second], srv.url)


def test_publish_bad_credentials(
    series_repo: ForkRepo, server: IndexServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWINE_PASSWORD", "wrong")
    wheel = released(series_repo, tmp_path / "d")
    with pytest.raises(PublishError, match=r"refused the credentials \(HTTP 40[13]\)"):
        publish(series_repo.config, [wheel], server.url)


def test_publish_repository_name_from_pypirc(
    series_repo: ForkRepo, server: IndexServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TWINE_USERNAME")
    monkeypatch.delenv("TWINE_PASSWORD")
    pypirc = tmp_path / "pypirc"
    pypirc.write_text(
        "[distutils]\nindex-servers = internal\n\n"
        f"[internal]\nrepository = {server.url}\nusername = {USER}\npassword = {PASSWORD}\n"
    )
    wheel = released(series_repo, tmp_path / "d")
    done = publish(series_repo.config, [wheel], "internal", config_file=str(pypirc))
    assert [d.action for d in done] == ["uploaded"]
    with pytest.raises(PublishError, match="twine: "):
        publish(series_repo.config, [wheel], "nosuch", config_file=str(pypirc))


def test_publish_unreachable_index(
    series_repo: ForkRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)
    wheel = released(series_repo, tmp_path / "d")
    url = f"http://127.0.0.1:{free_port()}/"
    assert main(["publish", str(wheel), "--repository", url]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("vllm-fork: error: cannot reach the index http://127.0.0.1:")


def test_publish_missing_file(series_repo: ForkRepo, tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="no such file"):
        publish(series_repo.config, [tmp_path / "none.whl"], "http://127.0.0.1:1/")


def test_release_notes_since_the_previous_published_version(
    series_repo: ForkRepo, server: IndexServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = record_for(series_repo)
    old = json.loads(json.dumps(record))
    old["version"] = old_version = VERSION.replace("hardened.1", "hardened.0")
    old["series"]["patches"] = []
    (tmp_path / "old").mkdir()
    # an older fork version already on the index (put there as an earlier publish did)
    fork_wheel(tmp_path / "old", old, version=old_version, tree=series_repo.root.parent / "wt")
    for f in (tmp_path / "old").iterdir():
        shutil.copy(f, server.packages / f.name)
    wheel = released(series_repo, tmp_path / "d")
    assert main(["release-notes", str(wheel), "--index-url", server.simple]) == 0
    out = capsys.readouterr().out
    assert f"Compared with {old_version}:" in out
    assert f"- added `{record['series']['patches'][0]['file']}`" in out
    # none older there: said so
    (server.packages / next((tmp_path / "old").iterdir()).name).unlink()
    assert main(["release-notes", str(wheel), "--index-url", server.simple]) == 0
    assert "First fork version of vLLM" in capsys.readouterr().out


def test_publish_without_credentials_says_so_before_verifying(
    series_repo: ForkRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A missing password is reported at once, not after verifying every wheel."""
    monkeypatch.delenv("TWINE_USERNAME", raising=False)
    monkeypatch.delenv("TWINE_PASSWORD", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.pypirc
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    wheel = released(series_repo, tmp_path / "d")

    def no_verify(*_args, **_kwargs):
        raise AssertionError("verified before the credentials were checked")

    monkeypatch.setattr("vllm_fork.deploy.publish.verify_release", no_verify)
    assert main(["publish", str(wheel), "--repository", f"http://127.0.0.1:{free_port()}/"]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("vllm-fork: error: twine: ")
