from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from vllm_fork.errors import (
    HashMismatchError,
    NetworkError,
    NotOnIndexError,
    OfflineError,
    UnknownVersionError,
)
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pins import FilePin, load_pins
from vllm_fork.sources.pipconf import PipConfig

from .conftest import FAKE_VERSION, ForkRepo, LocalIndex, make_sdist, sha256_of


def cache_files(repo: ForkRepo) -> list[Path]:
    cache = repo.config.cache_dir
    return sorted(
        p
        for p in cache.rglob("*")
        if p.is_file() and p.name != ".lock" and "state" not in p.relative_to(cache).parts
    )


def pin_of(repo: ForkRepo) -> FilePin:
    return load_pins(repo.config.bases_file).get(FAKE_VERSION).sdist


def test_good_download_lands_verified(fork_repo: ForkRepo) -> None:
    path = Fetcher(fork_repo.config).ensure(pin_of(fork_repo))
    assert path == fork_repo.config.dist_dir / fork_repo.sdist.name
    assert sha256_of(path) == sha256_of(fork_repo.sdist)
    assert cache_files(fork_repo) == [path]


def test_hash_mismatch_discards_download(fork_repo: ForkRepo, local_index: LocalIndex) -> None:
    good = pin_of(fork_repo)
    wrong = "0" * 64
    with pytest.raises(HashMismatchError) as err:
        Fetcher(fork_repo.config).ensure(FilePin(good.filename, wrong))
    assert str(err.value) == (
        f"sha256 mismatch for {good.filename} from {local_index.url}: "
        f"expected {wrong}, got {good.sha256}; the download was discarded"
    )
    assert cache_files(fork_repo) == []


def test_unknown_version_lists_known(fork_repo: ForkRepo) -> None:
    with pytest.raises(UnknownVersionError, match=r"vLLM 1\.2\.3 is not pinned .*known: 9\.9\.9"):
        load_pins(fork_repo.config.bases_file).get("1.2.3")


def test_file_missing_from_index(fork_repo: ForkRepo) -> None:
    with pytest.raises(NotOnIndexError, match="vllm-0.0.0.tar.gz is not on any configured index"):
        Fetcher(fork_repo.config).ensure(FilePin("vllm-0.0.0.tar.gz", "1" * 64))
    assert cache_files(fork_repo) == []


def test_offline_with_empty_cache(fork_repo: ForkRepo, local_index: LocalIndex) -> None:
    config = dataclasses.replace(fork_repo.config, offline=True)
    with pytest.raises(OfflineError, match="not in the cache .* offline mode is on"):
        Fetcher(config).ensure(pin_of(fork_repo))
    assert local_index.requests == []


def test_second_fetch_served_from_cache(
    fork_repo: ForkRepo, local_index: LocalIndex, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="vllm_fork.sources.fetch")
    first = Fetcher(fork_repo.config).ensure(pin_of(fork_repo))
    # the download says what it fetches, from where and why, in one line
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("downloading")]
    assert pin_of(fork_repo).filename in line and local_index.url in line
    assert "not in the cache" in line
    caplog.clear()
    local_index.stop()  # any network access would now fail
    count = len(local_index.requests)
    assert Fetcher(fork_repo.config).ensure(pin_of(fork_repo)) == first
    offline = dataclasses.replace(fork_repo.config, offline=True)
    assert Fetcher(offline).ensure(pin_of(fork_repo)) == first
    assert len(local_index.requests) == count
    assert not [r for r in caplog.records if r.getMessage().startswith("downloading")]


def test_corrupt_cache_is_downloaded_again(fork_repo: ForkRepo) -> None:
    path = Fetcher(fork_repo.config).ensure(pin_of(fork_repo))
    path.write_bytes(b"garbage")
    offline = dataclasses.replace(fork_repo.config, offline=True)
    with pytest.raises(OfflineError, match="is corrupt"):
        Fetcher(offline).ensure(pin_of(fork_repo))
    assert not path.exists()
    path2 = Fetcher(fork_repo.config).ensure(pin_of(fork_repo))
    assert sha256_of(path2) == pin_of(fork_repo).sha256


def test_later_index_is_searched_and_file_index_read(
    fork_repo: ForkRepo, local_index: LocalIndex, tmp_path: Path
) -> None:
    # A file:// index that lacks the project is skipped; one that has it is used.
    empty = tmp_path / "empty-index"
    empty.mkdir()
    local = tmp_path / "file-index"
    other = make_sdist(tmp_path, version="8.8.8")
    (local / "vllm").mkdir(parents=True)
    digest = hashlib.sha256(other.read_bytes()).hexdigest()
    (local / "vllm" / "index.html").write_text(
        f'<a href="{other.as_uri()}#sha256={digest}">{other.name}</a>'
    )
    pip = PipConfig(index_url=empty.as_uri(), extra_index_urls=(local_index.url, local.as_uri()))
    fetcher = Fetcher(fork_repo.config, pip)
    got = fetcher.ensure(FilePin(other.name, digest))
    assert got.read_bytes() == other.read_bytes()
    assert fetcher.ensure(pin_of(fork_repo)).name == fork_repo.sdist.name


def test_stale_partial_files_are_removed(fork_repo: ForkRepo) -> None:
    stale = fork_repo.config.tmp_dir / ".vllm-fork-tmp.vllm-9.9.9.tar.gz.abc.part"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half a download")
    # Entries without the tool's mark are not its own: cleanup leaves them alone.
    foreign = fork_repo.config.tmp_dir / "notes.part"
    foreign.write_text("mine")
    user_dir = fork_repo.config.tmp_dir / ".vllm-fork-tmp.tree.x"
    (user_dir / "src").mkdir(parents=True)
    Fetcher(fork_repo.config).ensure(pin_of(fork_repo))
    assert not stale.exists()
    assert foreign.read_text() == "mine" and (user_dir / "src").is_dir()


def test_unreachable_index_is_a_network_error(fork_repo: ForkRepo, local_index: LocalIndex) -> None:
    local_index.stop()
    with pytest.raises(NetworkError, match=r"cannot read index http://127\.0\.0\.1:\d+/simple/"):
        Fetcher(fork_repo.config).ensure(pin_of(fork_repo))
    assert cache_files(fork_repo) == []


def test_an_imported_release_is_read_while_another_run_holds_the_cache_lock(
    fork_repo: ForkRepo,
) -> None:
    """status and matrix read an imported release without waiting for the cache
    lock that a download or import of another release may hold for minutes."""
    import subprocess
    import sys
    import threading

    from vllm_fork.cache import lock_file
    from vllm_fork.sources.upstream import ensure_upstream

    config = fork_repo.config
    base = config.base(FAKE_VERSION)
    tag = ensure_upstream(config, base)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\n"
            "fh = open(sys.argv[1], 'a+b')\n"
            "fcntl.flock(fh, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n",
            str(lock_file(config.cache_dir)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(ensure_upstream(config, base)))
        reader.start()
        reader.join(timeout=120)
        assert not reader.is_alive(), "the reader waited for the cache lock"
        assert got == [tag]
    finally:
        holder.kill()
        holder.wait()
