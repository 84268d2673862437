"""`vllm-fork cache` and `cache prune` on a synthetic cache: every kind reported
with its size, prune removes exactly what no pinned base or recent run needs,
never what a running command holds, and waits for the cache lock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vllm_fork.cache import BUILD_ENV_READY, LAST_USED, TREE_PID_KEY, CacheLayout, lock_file
from vllm_fork.lock import MARKER, TMP_PREFIX
from vllm_fork.sources import cachekeep
from vllm_fork.sources.pins import Base, FilePin, Pins, save_pins
from vllm_fork.sources.workspace import load_config

OLD = time.time() - 40 * 86400  # older than the default 14 days


def _file(path: Path, size: int = 4096, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _age(path: Path, mtime: float) -> Path:
    os.utime(path, (mtime, mtime))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _git_tree(path: Path, pid: int) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "config", TREE_PID_KEY, str(pid)], check=True)
    _file(path / "vllm" / "x.py", 8192)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A repository pinning 1.0.0 (sdist, wheel) and a cache holding one entry of
    each kind that prune must remove and one of each it must keep."""
    root = tmp_path / "repo"
    root.mkdir()
    base = Base(
        "1.0.0",
        FilePin("vllm-1.0.0.tar.gz", "0" * 64),
        FilePin("vllm-1.0.0-cp38-abi3-manylinux1_x86_64.whl", "1" * 64),
    )
    save_pins(root / "bases.toml", Pins(default="1.0.0", bases={"1.0.0": base}))
    c = CacheLayout(tmp_path / "cache")
    dead = _dead_pid()
    gone: list[Path] = []
    kept: list[Path] = []

    # downloads: the pinned ones stay, one no base pins goes (with its record)
    kept += [_file(c.downloads / "vllm-1.0.0.tar.gz", 1 << 20)]
    kept += [_file(c.downloads / "vllm-1.0.0-cp38-abi3-manylinux1_x86_64.whl", 1 << 20)]
    gone += [_file(c.downloads / "vllm-0.9.0.tar.gz", 1 << 20)]
    kept += [_file(c.download_record("vllm-1.0.0.tar.gz"), 65)]
    gone += [_file(c.download_record("vllm-0.9.0.tar.gz"), 65)]
    kept += [_file(c.upstream_git / "objects" / "pack" / "p.pack", 1 << 16)]
    kept += [_file(c.upstream_record, 100)]
    # build environments: unused for 40 days, never finished; used yesterday
    old_env = c.build_env("py3.12-cuda-aaaa")
    _file(old_env / BUILD_ENV_READY, mtime=OLD)
    _file(old_env / LAST_USED, 0, mtime=OLD)
    _file(old_env / "lib" / "torch.so", 1 << 18)
    half = c.build_env("py3.12-cuda-bbbb")
    _file(half / "lib" / "partial.so", 1 << 16)
    fresh_env = c.build_env("py3.12-cuda-cccc")
    _file(fresh_env / BUILD_ENV_READY)
    _file(fresh_env / LAST_USED, 0)
    gone += [old_env, half]
    kept += [fresh_env]
    # tree venvs
    old_venv = c.tree_venvs / "torch-2.9.0"
    _file(old_venv / "bin" / "python", mtime=OLD)
    _file(old_venv / LAST_USED, 0, mtime=OLD)
    _age(old_venv, OLD)
    new_venv = c.tree_venvs / "torch-2.13.0"
    _file(new_venv / LAST_USED, 0)
    gone += [old_venv]
    kept += [new_venv]
    # work trees: a killed build's marked tree, a killed run's internal tree, one
    # untouched for 40 days; a running build's and a running run's trees stay
    killed_build = c.work / f"{TMP_PREFIX}build-1.0.0.abcd"
    _file(killed_build / MARKER, 0).write_text(f"{dead}\n")
    _file(killed_build / "src" / "big.bin", 1 << 18)
    running_build = c.work / f"{TMP_PREFIX}build-1.0.0.efgh"
    _file(running_build / MARKER, 0).write_text(f"{os.getpid()}\n")
    killed_tree = _git_tree(c.work / "backport-0123-1.0.0", dead)
    running_tree = _age(_git_tree(c.work / "release-check-1.0.0", os.getpid()), OLD)
    stale = c.work / "smoke-old"
    _file(stale / "venv" / "x", 1 << 12)
    _age(stale, OLD)
    fresh = c.work / "audit-new"
    _file(fresh / "x")
    gone += [killed_build, killed_tree, stale]
    kept += [running_build, running_tree, fresh]
    # backport runs, watch clones
    old_run = c.backport_run("dead0001")
    _file(old_run / "state.json", mtime=OLD)
    _age(old_run, OLD)
    new_run = c.backport_run("live0002")
    _file(new_run / "state.json")
    old_clone = c.watch_clone("aiter")
    _file(old_clone / "HEAD", mtime=OLD)
    _age(old_clone, OLD)
    gone += [old_run, old_clone]
    kept += [new_run]
    # matrix rows and probe findings: superseded, not pinned, current
    _file(c.matrix_rows / "1.0.0-aaaa.json", mtime=OLD)
    _file(c.matrix_rows / "1.0.0-bbbb.json")
    _file(c.matrix_rows / "0.9.0-cccc.json")
    _file(c.probes / "1.0.0-dddd.json")
    gone += [c.matrix_rows / "1.0.0-aaaa.json", c.matrix_rows / "0.9.0-cccc.json"]
    kept += [c.matrix_rows / "1.0.0-bbbb.json", c.probes / "1.0.0-dddd.json"]
    # release-check state of a release no longer pinned
    gone += [_file(c.release_check / "0.9.0.json")]
    kept += [_file(c.release_check / "1.0.0.json")]
    # what the tool does not name, and the locks, are never touched
    kept += [_file(c.root / "mine" / "notes.txt"), _file(c.dir_lock("abc"), 0)]
    monkeypatch.setenv("VLLM_FORK_ROOT", str(root))
    monkeypatch.setenv("VLLM_FORK_CACHE_DIR", str(c.root))
    return load_config(), gone, kept


def test_the_report_shows_every_kind_with_its_size(cache) -> None:
    config, gone, kept = cache
    survey = cachekeep.survey(config)
    by_kind = {k.name: survey.of(k) for k in cachekeep.KINDS}
    assert len(by_kind["downloads"]) == 3
    assert len(by_kind["build environments"]) == 3
    assert len(by_kind["tree venvs"]) == 2
    assert len(by_kind["work trees"]) == 6
    assert [e.path.name for e in by_kind["other"]] == ["mine"]
    assert by_kind["downloads"][0].size >= 1 << 20
    assert sorted(e.path for e in survey.prunable) == sorted(gone)
    text = cachekeep.format_survey(survey)
    for kind in ("downloads", "upstream git", "build environments", "tree venvs", "work trees"):
        assert kind in text
    assert any(line.startswith("watch clones") for line in text.splitlines())
    assert text.splitlines()[-1].startswith("total")


def test_prune_removes_what_nothing_needs_and_keeps_what_runs_hold(cache) -> None:
    config, gone, kept = cache
    dry = cachekeep.prune(config, dry_run=True)
    assert all(p.exists() for p in gone + kept), "a dry run removes nothing"
    assert sorted(e.path for e in dry.removed) == sorted(gone)
    assert "would free" in cachekeep.format_pruned(dry)

    done = cachekeep.prune(config)
    assert [p for p in gone if p.exists()] == []
    assert [p for p in kept if not p.exists()] == []
    assert done.after is not None and done.after.prunable == []
    assert done.freed == dry.freed > 1 << 20
    assert done.after.size == done.before.size - done.freed
    lines = cachekeep.format_pruned(done).splitlines()
    assert "removed dist/vllm-0.9.0.tar.gz (1.0 MiB): pinned for no base in bases.toml" in lines
    assert any("the run that made it (pid" in line and "is gone" in line for line in lines)
    assert lines[-1].startswith("freed ")
    # a second prune finds nothing
    assert cachekeep.prune(config).removed == []


def test_prune_waits_for_a_run_that_holds_the_cache(cache) -> None:
    config, gone, _ = cache
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys\n"
            "fh = open(sys.argv[1], 'a+b')\n"
            "fcntl.flock(fh, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.readline()\n",
            str(lock_file(config.cache_dir)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        worker = threading.Thread(target=cachekeep.prune, args=(config,))
        worker.start()
        worker.join(timeout=2)
        assert worker.is_alive(), "prune did not wait for the cache lock"
        assert all(p.exists() for p in gone)
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
        worker.join(timeout=60)
        assert not worker.is_alive()
    finally:
        holder.kill()
        holder.wait()
    assert [p for p in gone if p.exists()] == []


def test_the_cache_command(cache, capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_fork.cli.main import main

    config, gone, _ = cache
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"cache {config.cache_dir}\n") and "vllm-fork cache prune" in out
    assert main(["cache", "--dry-run"]) == 2  # --dry-run goes with prune
    assert "goes with `vllm-fork cache prune`" in capsys.readouterr().err
    assert main(["cache", "prune", "--dry-run"]) == 0
    assert "would free" in capsys.readouterr().out and all(p.exists() for p in gone)
    assert main(["cache", "prune", "--unused-days", "100"]) == 0
    out = capsys.readouterr().out
    assert "smoke-old" not in out and "vllm-0.9.0.tar.gz" in out  # 40 days < 100
    assert (config.cache.work / "smoke-old").exists()
