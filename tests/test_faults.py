"""Fault injection: kills at each step, corrupt caches, bad input, races.

Every case is a row of :data:`FAULTS` (class, case, expected outcome); the
table in docs/reliability.md is rendered from those rows and checked here,
so the documentation lists exactly what this suite exercises. Print it with
``python -m tests.test_faults``.

Kills go through the tool's named fault points (``VLLM_FORK_FAULT``, see
vllm_fork/faults.py) in a real ``vllm-fork`` subprocess: SIGKILL runs no
cleanup at all, SIGTERM runs the tool's own. Everything is synthetic: small
sdists served by the local test index, no real vLLM download.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_fork.cache import CacheLayout
from vllm_fork.cli.main import main
from vllm_fork.facts.names import tag_for
from vllm_fork.git import git_out
from vllm_fork.lock import TMP_PREFIX
from vllm_fork.sources.pins import Base, FilePin, load_pins, save_pins
from vllm_fork.sources.upstream import ensure_upstream

from .conftest import (
    FAKE_FILES,
    FAKE_VERSION,
    ForkRepo,
    LocalIndex,
    file_member,
    make_sdist,
    make_tar,
    sha256_of,
)
from .gitutil import git
from .seriesutil import logical_files, patch_names
from .test_hostile_wheels import CLASSES as HOSTILE_WHEEL_CLASSES
from .test_hostile_wheels import VERDICT as HOSTILE_WHEEL_VERDICT
from .test_tree import make_series


@dataclass(frozen=True)
class Fault:
    cls: str
    case: str
    outcome: str

    @property
    def id(self) -> str:
        return f"{self.cls}/{self.case}"


FAULTS: list[Fault] = []


def rows(cls: str, outcome: str, *cases: str) -> list[Fault]:
    made = [Fault(cls, case, outcome) for case in cases]
    FAULTS.extend(made)
    return made


def params(faults: list[Fault]) -> list:  # type: ignore[type-arg]
    return [pytest.param(f, id=f.id) for f in faults]


# --- helpers -----------------------------------------------------------------------


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a subprocess (so that it can be killed)."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_fork.cli.main", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def one_line_error(err: str) -> str:
    """The failure must be one clear line and no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("vllm-fork: error:")]
    assert len(lines) == 1, err
    return lines[0]


def leftovers(*dirs: Path) -> list[Path]:
    found: list[Path] = []
    for d in dirs:
        if d.is_dir():
            found += [p for p in d.iterdir() if p.name.startswith(TMP_PREFIX)]
    return found


def assert_complete(tree: Path, patches: int = 2) -> None:
    assert git_out(["rev-parse", "--abbrev-ref", "HEAD"], cwd=tree) == "fork"
    count = git_out(["rev-list", "--count", f"{tag_for(FAKE_VERSION)}..HEAD"], cwd=tree)
    assert int(count) == patches
    assert git_out(["status", "--porcelain"], cwd=tree) == ""
    subprocess.run(["git", "fsck", "--no-progress"], cwd=tree, check=True, capture_output=True)


# --- kills during materialize ------------------------------------------------------

KILL_MATERIALIZE = rows(
    "kill during materialize",
    "no DIR is left (never a partial one); the rerun succeeds with no cleanup",
    *(
        f"{action} at {point}"
        for point in ("clone", "checkout", "am", "rename")
        for action in ("SIGKILL", "SIGTERM")
    ),
)


@pytest.mark.parametrize("fault", params(KILL_MATERIALIZE))
def test_kill_during_materialize(fault: Fault, fork_repo: ForkRepo, tmp_path: Path) -> None:
    make_series(fork_repo, tmp_path)
    action, _, point = fault.case.partition(" at ")
    signal_name = {"SIGKILL": "kill", "SIGTERM": "term"}[action]
    target = tmp_path / "work" / "tree"
    proc = cli(
        "materialize", str(target), env={"VLLM_FORK_FAULT": f"materialize.{point}:{signal_name}"}
    )
    assert proc.returncode == (-9 if action == "SIGKILL" else 143), proc.stderr
    assert not target.exists()
    if action == "SIGTERM":
        assert "Traceback" not in proc.stderr and not leftovers(target.parent)
    proc = cli("materialize", str(target))
    assert proc.returncode == 0, proc.stderr
    assert_complete(target)
    assert not leftovers(target.parent)


# --- kills during fetch / import ---------------------------------------------------

KILL_FETCH = rows(
    "kill during fetch",
    "the cache holds only verified files; the rerun completes the import",
    *(
        f"SIGKILL at {point}"
        for point in (
            "fetch.download",
            "fetch.store",
            "upstream.init",
            "upstream.commit",
            "upstream.tag",
            "upstream.repack",
        )
    ),
)


@pytest.mark.parametrize("fault", params(KILL_FETCH))
def test_kill_during_fetch(fault: Fault, fork_repo: ForkRepo, tmp_path: Path) -> None:
    point = fault.case.split(" at ")[1]
    cache = fork_repo.config.cache_dir
    proc = cli("fetch", env={"VLLM_FORK_FAULT": f"{point}:kill"})
    assert proc.returncode == -9, proc.stderr
    dist = CacheLayout(cache).downloads / fork_repo.sdist.name
    assert not dist.exists() or sha256_of(dist) == sha256_of(fork_repo.sdist)
    proc = cli("fetch")
    assert proc.returncode == 0, proc.stderr
    assert not leftovers(CacheLayout(cache).tmp)
    assert "corrupt" not in proc.stderr
    # the import equals a clean one (deterministic commit)
    clean = load_clean_commit(fork_repo, tmp_path)
    assert (
        git_out(["--git-dir", CacheLayout(cache).upstream_git, "rev-parse", tag_for(FAKE_VERSION)])
        == clean
    )


def load_clean_commit(repo: ForkRepo, tmp_path: Path) -> str:
    from dataclasses import replace

    config = replace(repo.config, cache_dir=tmp_path / "clean-cache")
    base = load_pins(config.bases_file).get(FAKE_VERSION)
    ensure_upstream(config, base)
    return git_out(["--git-dir", config.upstream_repo, "rev-parse", tag_for(FAKE_VERSION)])


# --- kills during rebase ----------------------------------------------------------

KILL_REBASE = rows(
    "kill during rebase",
    "`rebase --abort` restores the tree and series exactly; `--continue` finishes instead",
    *(
        f"SIGKILL at {point}, then {then}"
        for point in ("pick", "finish")
        for then in ("abort", "continue")
    ),
)


@pytest.mark.parametrize("fault", params(KILL_REBASE))
def test_kill_during_rebase(fault: Fault, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_fork.tree.materialize import materialize

    from .rebase_support import (
        CLEAN_SERIES,
        V1,
        V1_FILES,
        V2,
        V2_FILES,
        make_fork,
        series_files,
        snapshot,
    )

    fork = make_fork(tmp_path, monkeypatch, {V1: V1_FILES, V2: V2_FILES}, default=V1)
    fork.write_series(V1, CLEAN_SERIES)
    tree = tmp_path / "tree"
    materialize(fork.config, V1, tree)
    before, series_before = snapshot(tree), series_files(fork.series_dir(V1))
    point, then = fault.case.removeprefix("SIGKILL at ").split(", then ")
    proc = cli(
        "rebase",
        "--from",
        V1,
        "--onto",
        V2,
        str(tree),
        env={"VLLM_FORK_FAULT": f"rebase.{point}:kill"},
    )
    assert proc.returncode == -9, proc.stderr
    proc = cli("rebase", f"--{then}", str(tree))
    assert proc.returncode == 0, proc.stderr
    if then == "abort":
        assert snapshot(tree) == before
        assert series_files(fork.series_dir(V1)) == series_before
        assert not fork.series_dir(V2).exists()
    else:
        assert git_out(["config", "vllm-fork.base"], cwd=tree) == V2
        assert (fork.series_dir(V2) / "series").is_file()
        assert git_out(["status", "--porcelain"], cwd=tree) == ""


# --- kills during build ------------------------------------------------------------

KILL_BUILD = rows(
    "kill during build",
    "DIST gets the whole verified wheel or no wheel (never a partial one); the next build "
    "removes the killed run's tree from <cache>/work and succeeds",
    *(
        f"{action} at {point}"
        for point in ("materialized", "backend", "verify", "publish")
        for action in ("SIGKILL", "SIGTERM")
    ),
)


@pytest.mark.parametrize("fault", params(KILL_BUILD))
def test_kill_during_build(fault: Fault, fork_repo: ForkRepo, tmp_path: Path) -> None:
    from .buildutil import make_series as series_of
    from .buildutil import pin_upstream_wheel, python_patch
    from .test_build_plan import fake_build_python, in_tree_backend

    pin_upstream_wheel(fork_repo, tmp_path / "upstream")
    series_of(fork_repo, tmp_path, python_patch, in_tree_backend)
    action, _, point = fault.case.partition(" at ")
    signal_name = {"SIGKILL": "kill", "SIGTERM": "term"}[action]
    dist = tmp_path / "dist"
    argv = ["build", "--mode", "empty", "--build-python", str(fake_build_python(tmp_path))]
    argv += ["-o", str(dist)]
    work = fork_repo.config.cache.work
    proc = cli(*argv, env={"VLLM_FORK_FAULT": f"build.{point}:{signal_name}"})
    assert proc.returncode == (-9 if action == "SIGKILL" else 143), proc.stderr
    assert not list(dist.glob("*.whl"))  # no wheel, whole or partial
    if action == "SIGTERM":
        assert "Traceback" not in proc.stderr
        assert not list(work.iterdir()) and not list(dist.iterdir())
    proc = cli(*argv)
    assert proc.returncode == 0, proc.stderr
    [wheel] = dist.glob("*.whl")
    assert main(["verify", str(wheel)]) == 0
    assert not list(work.iterdir())  # the killed run's tree is gone too
    assert not [p for p in dist.iterdir() if p.name.startswith(TMP_PREFIX)]


# --- a corrupt cache ---------------------------------------------------------------


def _pack(cache: Path, suffix: str) -> Path:
    return next((CacheLayout(cache).upstream_git / "objects" / "pack").glob(f"pack-*{suffix}"))


def _flip_byte(path: Path) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _forge_moved_tag(cache: Path) -> None:
    repo = CacheLayout(cache).upstream_git
    tag = f"refs/tags/{tag_for(FAKE_VERSION)}"
    tree = git_out(["--git-dir", repo, "rev-parse", f"{tag}^{{tree}}"])
    message = git_out(["--git-dir", repo, "log", "-1", "--format=%B", tag])
    env = {**os.environ, "GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x"}
    env |= {"GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@x"}
    forged = subprocess.run(
        ["git", "--git-dir", repo, "commit-tree", tree, "-m", message + "\nforged\n"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()
    git(repo, "update-ref", tag, forged)


CORRUPTIONS = {
    "pack file deleted": lambda cache: _pack(cache, ".pack").unlink(),
    "pack index deleted (objects missing)": lambda cache: _pack(cache, ".idx").unlink(),
    "byte flipped in the pack": lambda cache: _flip_byte(_pack(cache, ".pack")),
    "tag moved to a forged commit": _forge_moved_tag,
    "tag deleted": lambda cache: git(
        CacheLayout(cache).upstream_git, "update-ref", "-d", f"refs/tags/{tag_for(FAKE_VERSION)}"
    ),
    "import record unreadable": lambda cache: CacheLayout(cache).upstream_record.write_text("{"),
    "upstream git removed": lambda cache: shutil.rmtree(CacheLayout(cache).upstream_git),
}
CORRUPT_GIT = rows(
    "corrupt cached upstream git",
    "detected on the next run, said so in one line, rebuilt from the verified sdist",
    *CORRUPTIONS,
)


@pytest.mark.parametrize("fault", params(CORRUPT_GIT))
def test_corrupt_upstream_git_is_rebuilt(
    fault: Fault, fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = fork_repo.config.cache_dir
    base = load_pins(fork_repo.config.bases_file).get(FAKE_VERSION)
    ensure_upstream(fork_repo.config, base)
    good = git_out(
        ["--git-dir", CacheLayout(cache).upstream_git, "rev-parse", tag_for(FAKE_VERSION)]
    )
    CORRUPTIONS[fault.case](cache)
    target = tmp_path / "tree"
    code, err = run_main(capsys, "materialize", str(target))
    assert code == 0, err
    assert git_out(["rev-parse", tag_for(FAKE_VERSION)], cwd=target) == good
    if fault.case not in {"import record unreadable", "upstream git removed"}:
        assert "is corrupt" in err and "rebuilding it from the verified sdist" in err
    # the next run finds a sound cache and says nothing
    code, err = run_main(capsys, "fetch")
    assert (code, "corrupt" in err) == (0, False), err


CORRUPT_DIST = rows(
    "corrupt cached sdist",
    "a changed pin and a damaged file get different messages; the pinned file is fetched again",
    "byte flipped in the cached sdist",
    "cached sdist truncated",
    "pin changed to another sdist",
)


@pytest.mark.parametrize("fault", params(CORRUPT_DIST))
def test_corrupt_or_repinned_sdist(
    fault: Fault,
    fork_repo: ForkRepo,
    local_index: LocalIndex,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_main(capsys, "fetch")[0] == 0
    cached = fork_repo.config.dist_dir / fork_repo.sdist.name
    if fault.case == "pin changed to another sdist":
        other = tmp_path / "other"
        other.mkdir()
        files = dict(FAKE_FILES, **{"vllm/extra.py": "x = 2\n"})
        sdist = make_sdist(other, files=files)
        local_index.publish(sdist)
        repin(fork_repo, sdist)
        code, err = run_main(capsys, "fetch")
        assert code == 0, err
        assert "the pin of vllm-9.9.9.tar.gz changed" in err and "corrupt" not in err
        assert "the pin of vLLM 9.9.9 changed since it was imported" in err
        assert sha256_of(cached) == sha256_of(sdist)
        return
    if fault.case == "cached sdist truncated":
        cached.write_bytes(cached.read_bytes()[:100])
    else:
        _flip_byte(cached)
    code, err = run_main(capsys, "fetch")
    assert code == 0, err
    assert "cached vllm-9.9.9.tar.gz is corrupt" in err and "pin of" not in err
    assert sha256_of(cached) == sha256_of(fork_repo.sdist)


def repin(repo: ForkRepo, sdist: Path) -> None:
    pins = load_pins(repo.config.bases_file)
    old = pins.bases[FAKE_VERSION]
    pins.bases[FAKE_VERSION] = Base(
        FAKE_VERSION, FilePin(sdist.name, sha256_of(sdist)), supported=old.supported
    )
    save_pins(repo.config.bases_file, pins)


# --- malformed configuration -------------------------------------------------------

BAD_BASES = {
    "not TOML": "default = \n",
    "bases is not a table": 'bases = "x"\n',
    "entry is not a table": 'bases."9.9.9" = 3\n',
    "sha256 is not a string": '[bases."9.9.9".sdist]\nfilename = "a.tar.gz"\nsha256 = 5\n',
    "sdist missing": '[bases."9.9.9"]\nsupported = true\n',
    "default is not a string": 'default = 1\n[bases."9.9.9".sdist]\nfilename = "a"\n'
    'sha256 = "' + "a" * 64 + '"\n',
    "supported is not a boolean": '[bases."9.9.9"]\nsupported = "yes"\n[bases."9.9.9".sdist]\n'
    'filename = "a"\nsha256 = "' + "a" * 64 + '"\n',
    "version key is not a version": '[bases."latest".sdist]\nfilename = "a"\nsha256 = "'
    + "a" * 64
    + '"\n',
    "not UTF-8": b"\xff\xfe = 1\n",
}
MALFORMED = rows(
    "malformed bases.toml",
    "exit 3, one line naming the file and the entry; no traceback",
    *BAD_BASES,
)


@pytest.mark.parametrize("fault", params(MALFORMED))
def test_malformed_bases_toml(
    fault: Fault, fork_repo: ForkRepo, capsys: pytest.CaptureFixture[str]
) -> None:
    text = BAD_BASES[fault.case]
    path = fork_repo.config.bases_file
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, err = run_main(capsys, "materialize", str(fork_repo.root / "t"))
    assert code == 3
    assert "bases.toml" in one_line_error(err)


# --- hostile or damaged archives ---------------------------------------------------


def _hostile(directory: Path, kind: str) -> Path:
    top = f"vllm-{FAKE_VERSION}"
    base = [file_member(f"{top}/PKG-INFO", FAKE_FILES["PKG-INFO"].encode())]
    path = directory / f"{top}.tar.gz"
    if kind == "truncated gzip":
        make_sdist(directory)
        path.write_bytes(path.read_bytes()[:-200])
        return path
    extra: tarfile.TarInfo
    if kind == "'..' member":
        return make_tar(path, [*base, file_member(f"{top}/../evil.py", b"x")])
    if kind == "absolute member":
        return make_tar(path, [*base, file_member("/tmp/evil.py", b"x")])
    if kind == "member name too long":
        return make_tar(path, [*base, file_member(f"{top}/{'n' * 300}.py", b"x")])
    if kind == "member path too deep":
        deep = "/".join(["d" * 200] * 25)
        return make_tar(path, [*base, file_member(f"{top}/{deep}/f.py", b"x")])
    if kind == "member under a file":
        return make_tar(
            path, [*base, file_member(f"{top}/pkg", b"x"), file_member(f"{top}/pkg/m.py", b"x")]
        )
    extra = tarfile.TarInfo(f"{top}/link")
    extra.type = tarfile.SYMTYPE if kind == "symlink member" else tarfile.CHRTYPE
    extra.linkname = "/etc/passwd"
    return make_tar(path, [*base, (extra, None)])


HOSTILE = rows(
    "hostile or damaged sdist",
    "exit 1, one line naming the archive; nothing imported, nothing written outside the cache",
    "truncated gzip",
    "'..' member",
    "absolute member",
    "symlink member",
    "device member",
    "member name too long",
    "member path too deep",
    "member under a file",
)


@pytest.mark.parametrize("fault", params(HOSTILE))
def test_hostile_sdist(
    fault: Fault,
    fork_repo: ForkRepo,
    local_index: LocalIndex,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = tmp_path / "hostile"
    d.mkdir()
    sdist = _hostile(d, fault.case)
    local_index.publish(sdist)
    repin(fork_repo, sdist)
    code, err = run_main(capsys, "materialize", str(tmp_path / "tree"))
    assert code == 1
    assert "vllm-9.9.9" in one_line_error(err)
    assert not (tmp_path / "tree").exists() and not (tmp_path / "evil.py").exists()
    assert not leftovers(fork_repo.config.cache.tmp)


# --- the environment ---------------------------------------------------------------

ENVIRONMENT = rows(
    "file-system faults",
    "one line naming the path and what to do; nothing the user made is touched",
    "cache not writable",
    "cache path under a regular file",
    "DIR path under a regular file",
    "DIR inside the cache",
    "user directory in <cache>/tmp",
)


@pytest.mark.parametrize("fault", params(ENVIRONMENT))
def test_file_system_faults(
    fault: Fault,
    fork_repo: ForkRepo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cache = fork_repo.config.cache_dir
    blocker = tmp_path / "file"
    blocker.write_text("a regular file")
    target = tmp_path / "tree"
    if fault.case == "cache not writable":
        if os.geteuid() == 0:  # root writes through modes: use a file system that refuses
            monkeypatch.setenv("VLLM_FORK_CACHE_DIR", "/sys/vllm-fork-cache")
        else:
            cache.mkdir()
            cache.chmod(0o555)
        code, err = run_main(capsys, "materialize", str(target))
        assert code == 4 and "cache" in one_line_error(err)
    elif fault.case == "cache path under a regular file":
        monkeypatch.setenv("VLLM_FORK_CACHE_DIR", str(blocker / "cache"))
        code, err = run_main(capsys, "fetch")
        assert code == 4 and str(blocker) in one_line_error(err)
    elif fault.case == "DIR path under a regular file":
        code, err = run_main(capsys, "materialize", str(blocker / "tree"))
        assert code == 1 and f"{blocker} is not a directory" in one_line_error(err)
    elif fault.case == "DIR inside the cache":
        code, err = run_main(capsys, "materialize", str(CacheLayout(cache).tmp / "tree"))
        assert code == 1 and "inside the vllm-fork cache" in one_line_error(err)
    else:
        mine = CacheLayout(cache).tmp / "my-tree"
        (mine / "src").mkdir(parents=True)
        (mine / "src" / "edit.py").write_text("my work\n")
        assert run_main(capsys, "fetch")[0] == 0
        assert (mine / "src" / "edit.py").read_text() == "my work\n"
    assert blocker.read_text() == "a regular file"


FULL_FS = rows(
    "full or read-only file system",
    "exit 4, one line naming the cache path and the errno text; never called a bad archive",
    "ENOSPC while unpacking the sdist",
    "EROFS while unpacking the sdist",
)


@pytest.mark.parametrize("fault", params(FULL_FS))
def test_full_file_system_is_a_file_system_fault(fault: Fault, fork_repo: ForkRepo) -> None:
    action = fault.case.split()[0].lower()
    proc = cli("fetch", env={"VLLM_FORK_FAULT": f"unpack.member:{action}"})
    assert proc.returncode == 4, proc.stderr
    line = one_line_error(proc.stderr)
    text = "No space left on device" if action == "enospc" else "Read-only file system"
    assert text in line and str(fork_repo.config.cache_dir) in line, line
    assert "damaged" not in line and "archive)" not in line
    assert not leftovers(fork_repo.config.cache.tmp)
    assert cli("fetch").returncode == 0  # nothing half-made blocks the rerun


# --- hostile wheels (tests/test_hostile_wheels.py) ---------------------------------

for _cls, _cases in HOSTILE_WHEEL_CLASSES.items():
    rows(f"hostile wheel: {_cls}", HOSTILE_WHEEL_VERDICT, _cases)


# --- the user's work ---------------------------------------------------------------

USER_WORK = rows(
    "existing work",
    "refused (exit 1, says what DIR holds); the user's tree and edits are intact",
    "second materialize of another base into a finished tree",
    "materialize into a non-empty plain directory",
)


@pytest.mark.parametrize("fault", params(USER_WORK))
def test_existing_work_is_never_replaced(
    fault: Fault, fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "tree"
    if fault.case.startswith("second"):
        assert run_main(capsys, "materialize", str(target))[0] == 0
        (target / "vllm" / "layer.py").write_text("my edit\n")
        pins = load_pins(fork_repo.config.bases_file)
        other = pins.bases[FAKE_VERSION]
        pins.bases["9.9.8"] = Base("9.9.8", other.sdist, supported=True)
        save_pins(fork_repo.config.bases_file, pins)
        code, err = run_main(capsys, "materialize", "--base", "9.9.8", str(target))
        assert code == 1 and "holds a work tree of vLLM 9.9.9" in one_line_error(err)
        assert (target / "vllm" / "layer.py").read_text() == "my edit\n"
    else:
        target.mkdir()
        (target / "notes.txt").write_text("mine")
        code, err = run_main(capsys, "materialize", str(target))
        assert code == 1 and "it holds notes.txt" in one_line_error(err)
        assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]


CONCURRENT = rows(
    "concurrent runs",
    "one materialize proceeds, the other waits and then refuses the finished DIR; DIR is complete",
    "two materialize runs on one DIR",
)


@pytest.mark.parametrize("fault", params(CONCURRENT))
def test_concurrent_materialize(fault: Fault, fork_repo: ForkRepo, tmp_path: Path) -> None:
    make_series(fork_repo, tmp_path)
    target = tmp_path / "tree"
    argv = [sys.executable, "-m", "vllm_fork.cli.main", "materialize", str(target)]
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    loser = next(err for code, err in results if code == 1)
    assert "holds a work tree of vLLM 9.9.9" in one_line_error(loser)
    assert_complete(target)
    assert not leftovers(tmp_path)


# --- export ------------------------------------------------------------------------

EXPORT = rows(
    "export that would lose patches",
    "exit 2 listing what would be removed; series untouched; --force exports",
    "detached HEAD three commits back",
    "branch behind the fork branch",
)


@pytest.mark.parametrize("fault", params(EXPORT))
def test_export_never_drops_patches_silently(
    fault: Fault, fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = make_series(fork_repo, tmp_path)
    series_dir = fork_repo.series_dir()
    before = logical_files(fork_repo.config.series_root)
    if fault.case.startswith("detached"):
        git(tree, "checkout", "-q", "--detach", "HEAD~2")
    else:
        git(tree, "checkout", "-q", "-b", "old", "HEAD~1")
    code, err = run_main(capsys, "export", str(tree))
    assert code == 2
    line = one_line_error(err)
    assert "would drop" in line and "--force" in line
    assert "export would remove 0002-ROCm-Tests-Cover-f3.patch" in err
    assert logical_files(fork_repo.config.series_root) == before
    code, err = run_main(capsys, "export", "--force", str(tree))
    assert code == 0 and "0002-ROCm-Tests-Cover-f3.patch" not in patch_names(series_dir)


# --- unsupported bases -------------------------------------------------------------

UNSUPPORTED = rows(
    "unsupported base",
    "exit 2 unless --allow-unsupported; no wheel is labelled +hardened without patches",
    "materialize a base marked unsupported",
    "build a base with no patches",
)


@pytest.mark.parametrize("fault", params(UNSUPPORTED))
def test_unsupported_base(
    fault: Fault, fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pins = load_pins(fork_repo.config.bases_file)
    base = pins.bases[FAKE_VERSION]
    if fault.case.startswith("materialize"):
        pins.bases[FAKE_VERSION] = Base(FAKE_VERSION, base.sdist, supported=False)
        save_pins(fork_repo.config.bases_file, pins)
        code, err = run_main(capsys, "materialize", str(tmp_path / "t"))
        assert code == 2 and "not a supported base" in one_line_error(err)
        assert not (tmp_path / "t").exists()
        code, err = run_main(capsys, "materialize", "--allow-unsupported", str(tmp_path / "t"))
        assert code == 0 and "using it anyway" in err
    else:
        code, err = run_main(capsys, "build", "--dry-run")
        assert code == 2 and "has no patches" in one_line_error(err)


# --- the table ---------------------------------------------------------------------

BEGIN = "<!-- fault table: generated by `python -m tests.test_faults`; checked by the suite -->"
END = "<!-- end of fault table -->"


def render_table() -> str:
    lines = [BEGIN, "", "| Fault class | Case | Outcome (asserted) |", "|---|---|---|"]
    for fault in FAULTS:
        lines.append(f"| {fault.cls} | {fault.case} | {fault.outcome} |")
    lines += ["", f"{len(FAULTS)} cases in {len({f.cls for f in FAULTS})} classes.", "", END]
    return "\n".join(lines)


def test_reliability_doc_lists_every_fault() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "reliability.md").read_text()
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    assert doc[start:end] == render_table(), "regenerate with `python -m tests.test_faults`"


def test_fault_hook_is_inert_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_fork import faults

    monkeypatch.delenv(faults.ENV, raising=False)
    faults.point("materialize.am")
    monkeypatch.setenv(faults.ENV, "materialize.am:error")
    with pytest.raises(OSError, match="injected fault"):
        faults.point("materialize.am")


if __name__ == "__main__":
    print(render_table())
