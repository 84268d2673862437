from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fork import __version__
from vllm_fork.cli.main import main
from vllm_fork.sources.pins import Base, FilePin, Pins, save_pins

from .conftest import FAKE_VERSION, ForkRepo, LocalIndex, file_member, make_tar, sha256_of


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def repin(repo: ForkRepo, sdist: Path, sha: str | None = None) -> None:
    base = Base(FAKE_VERSION, FilePin(sdist.name, sha or sha256_of(sdist)), supported=True)
    save_pins(repo.config.bases_file, Pins(default=FAKE_VERSION, bases={FAKE_VERSION: base}))


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"vllm-fork {__version__}"


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], fork_repo: ForkRepo) -> None:
    code, _, err = run(capsys, "nonsense")
    assert code == 2 and "invalid choice" in err
    code, _, err = run(capsys, "materialize", "--base", "1.2.3", "x")
    assert code == 2
    assert err == "vllm-fork: error: vLLM 1.2.3 is not pinned in bases.toml (known: 9.9.9)\n"


def download_line(filename: str, url: str) -> str:
    """What a command says on stderr before it downloads a pinned file."""
    return (
        f"vllm-fork: downloading {filename} from {url} (not in the cache: pinned in bases.toml)\n"
    )


def test_hash_mismatch_exit_1(
    capsys: pytest.CaptureFixture[str], fork_repo: ForkRepo, local_index: LocalIndex
) -> None:
    repin(fork_repo, fork_repo.sdist, "f" * 64)
    code, _, err = run(capsys, "fetch")
    assert code == 1
    assert err == download_line("vllm-9.9.9.tar.gz", local_index.url) + (
        f"vllm-fork: error: sha256 mismatch for vllm-9.9.9.tar.gz from {local_index.url}: "
        f"expected {'f' * 64}, got {sha256_of(fork_repo.sdist)}; the download was discarded\n"
    )
    assert not any(fork_repo.config.cache.downloads.iterdir())


def test_hostile_sdist_exit_1_and_nothing_imported(
    capsys: pytest.CaptureFixture[str],
    fork_repo: ForkRepo,
    local_index: LocalIndex,
    tmp_path: Path,
) -> None:
    hostile_dir = tmp_path / "hostile"
    hostile_dir.mkdir()
    top = f"vllm-{FAKE_VERSION}"
    sdist = make_tar(
        hostile_dir / f"{top}.tar.gz",
        [file_member(f"{top}/PKG-INFO", b"x"), file_member(f"{top}/../../evil.py", b"x")],
    )
    local_index.publish(sdist)
    repin(fork_repo, sdist)
    target = tmp_path / "tree"
    code, _, err = run(capsys, "materialize", str(target))
    assert code == 1
    assert err == download_line("vllm-9.9.9.tar.gz", local_index.url) + (
        "vllm-fork: error: vllm-9.9.9.tar.gz: refusing archive member 'vllm-9.9.9/../../evil.py': "
        "'..' path component\n"
    )
    assert not target.exists()
    assert not (tmp_path / "evil.py").exists()
    assert list(fork_repo.config.cache.tmp.iterdir()) == []


def test_materialize_export_status_commands(
    capsys: pytest.CaptureFixture[str], fork_repo: ForkRepo, local_index: LocalIndex, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    code, out, err = run(capsys, "materialize", str(tree))
    # the one thing said on stderr: the sdist it had to download
    assert (code, err) == (0, download_line("vllm-9.9.9.tar.gz", local_index.url))
    assert out == f"{tree}: vLLM 9.9.9 + 0 patch(es) on branch fork\n"
    code, out, _ = run(capsys, "export", str(tree))
    series = fork_repo.root.resolve() / "series" / "9.9.9"
    assert (code, out) == (0, f"{series}: 0 patch(es), unchanged\n")
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0 and json.loads(out)["base"] == "9.9.9"
    code, _, err = run(capsys, "materialize", str(tree))
    assert code == 1 and "is not empty; refusing" in err
    code, _, err = run(capsys, "export", str(tmp_path))
    assert code == 1 and "is not a git work tree made by `vllm-fork materialize`" in err


def test_offline_flag(capsys: pytest.CaptureFixture[str], fork_repo: ForkRepo) -> None:
    code, _, err = run(capsys, "--offline", "fetch")
    assert code == 1 and "offline mode is on" in err


def test_fetch_with_wheel(
    capsys: pytest.CaptureFixture[str],
    fork_repo: ForkRepo,
    local_index: LocalIndex,
    tmp_path: Path,
) -> None:
    wheel = tmp_path / f"vllm-{FAKE_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"binary wheel")
    local_index.publish(wheel)
    base = Base(
        FAKE_VERSION,
        FilePin(fork_repo.sdist.name, sha256_of(fork_repo.sdist)),
        FilePin(wheel.name, sha256_of(wheel)),
    )
    save_pins(fork_repo.config.bases_file, Pins(default=FAKE_VERSION, bases={FAKE_VERSION: base}))
    code, out, err = run(capsys, "fetch", "--wheel")
    dist = fork_repo.config.dist_dir
    assert (code, err) == (
        0,
        download_line(fork_repo.sdist.name, local_index.url)
        + download_line(wheel.name, local_index.url),
    )
    assert out.splitlines() == [str(dist / fork_repo.sdist.name), str(dist / wheel.name)]
    assert (dist / wheel.name).read_bytes() == b"binary wheel"
