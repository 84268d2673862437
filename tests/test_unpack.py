from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from vllm_fork.errors import UnsafeArchiveError
from vllm_fork.sources.unpack import safe_extract

from .conftest import file_member, make_tar

TOP = "vllm-1.0"


def special(name: str, kind: bytes, linkname: str = "", mode: int = 0o644) -> tuple:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = mode
    return info, None


def good_members() -> list[tuple]:
    return [
        file_member(f"{TOP}/PKG-INFO", b"Name: vllm\n"),
        file_member(f"{TOP}/vllm/__init__.py", b"x = 1\n"),
        file_member(f"{TOP}/tools/run.sh", b"#!/bin/sh\n", mode=0o775),
    ]


def test_good_archive_is_stripped_and_not_chowned(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "good.tar.gz", good_members())
    dest = tmp_path / "out"
    safe_extract(archive, dest, TOP)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "PKG-INFO",
        "tools/run.sh",
        "vllm/__init__.py",
    ]
    # the archive says uid 4242: extraction must not take it over
    assert (dest / "PKG-INFO").stat().st_uid == os.getuid()
    assert os.access(dest / "tools" / "run.sh", os.X_OK)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".unpack-")] == []


HOSTILE = {
    "traversal": (file_member(f"{TOP}/../../evil.txt", b"x"), "'..' path component"),
    "absolute": (file_member("/tmp/evil-vllm-fork.txt", b"x"), "absolute path"),
    "symlink-out": (special(f"{TOP}/link", tarfile.SYMTYPE, "/etc/passwd"), "symlink"),
    "hardlink-out": (special(f"{TOP}/hard", tarfile.LNKTYPE, "../../outside"), "hardlink"),
    "device": (special(f"{TOP}/dev", tarfile.CHRTYPE), "device file"),
    "fifo": (special(f"{TOP}/fifo", tarfile.FIFOTYPE), "fifo"),
    "setuid": (file_member(f"{TOP}/suid", b"x", mode=0o4755), "setuid"),
    "git-dir": (file_member(f"{TOP}/.git/hooks/post-checkout", b"x"), "'.git' path component"),
    "outside-top": (file_member("other/file.py", b"x"), "outside the top-level directory"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archive_is_refused(tmp_path: Path, case: str) -> None:
    member, reason = HOSTILE[case]
    archive = make_tar(tmp_path / f"{case}.tar.gz", [*good_members(), member])
    dest = tmp_path / "work" / "out"
    with pytest.raises(UnsafeArchiveError, match=reason):
        safe_extract(archive, dest, TOP)
    # nothing extracted: no target, no staging directory, nothing outside
    assert not dest.exists()
    assert list((tmp_path / "work").iterdir()) == []
    assert not (tmp_path / "evil.txt").exists()
    assert not Path("/tmp/evil-vllm-fork.txt").exists()


def test_existing_target_is_refused(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "good.tar.gz", good_members())
    (tmp_path / "out").mkdir()
    with pytest.raises(UnsafeArchiveError, match="already exists"):
        safe_extract(archive, tmp_path / "out", TOP)


def test_not_a_tarball(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.tar.gz"
    bogus.write_bytes(b"not a tar")
    with pytest.raises(UnsafeArchiveError, match="cannot extract bogus.tar.gz"):
        safe_extract(bogus, tmp_path / "out", TOP)
    assert not (tmp_path / "out").exists()


# --- the archive's names or the disk: which one is at fault --------------------------

NAME_FAULTS = {
    # a component longer than NAME_MAX (255 on Linux file systems)
    "name too long": [file_member(f"{TOP}/{'n' * 300}.py", b"x\n")],
    # a path longer than PATH_MAX (4096) in components that are each fine
    "path too deep": [file_member(f"{TOP}/" + "/".join(["d" * 200] * 25) + "/f.py", b"x\n")],
    # a member under a path that an earlier member made a regular file
    "file over directory": [
        file_member(f"{TOP}/pkg", b"a file\n"),
        file_member(f"{TOP}/pkg/mod.py", b"x\n"),
    ],
}


@pytest.mark.parametrize("case", sorted(NAME_FAULTS))
def test_unmakeable_member_names_blame_the_archive(tmp_path: Path, case: str) -> None:
    archive = make_tar(tmp_path / "names.tar.gz", [*good_members(), *NAME_FAULTS[case]])
    with pytest.raises(UnsafeArchiveError, match="cannot be created") as info:
        safe_extract(archive, tmp_path / "out", TOP)
    message = str(info.value)
    assert "names.tar.gz" in message and "the archive's names are at fault" in message
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["names.tar.gz"]  # no staging left


_ON_SMALL_FS = """
import sys
from pathlib import Path
from vllm_fork.errors import FileSystemFault
from vllm_fork.sources.unpack import safe_extract
try:
    safe_extract(Path(sys.argv[1]), Path(sys.argv[2]) / "out", sys.argv[3])
except FileSystemFault as exc:
    print("FS", exc)
    sys.exit(4)
except Exception as exc:
    print("OTHER", type(exc).__name__, exc)
    sys.exit(1)
"""


@pytest.mark.parametrize("mount", ["size=64k", "ro"])
def test_a_full_or_read_only_disk_is_a_file_system_fault(tmp_path: Path, mount: str) -> None:
    """A real tmpfs, too small or read-only, in a mount namespace of its own."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    members = [*good_members(), file_member(f"{TOP}/big.bin", os.urandom(256 * 1024))]
    archive = make_tar(tmp_path / "big.tar.gz", members)
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {disk} || exit 99; "
        + (f"mount -o remount,ro {disk} || exit 99; " if mount == "ro" else "")
        + f'exec "{sys.executable}" -c "$0" "$@"'
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, _ON_SMALL_FS, str(archive), str(disk), TOP],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode == 99 or "Operation not permitted" in proc.stderr:
        pytest.skip(f"no tmpfs mount here: {proc.stderr.strip()}")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    text = "No space left on device" if mount.startswith("size") else "Read-only file system"
    assert text in proc.stdout and "damaged" not in proc.stdout
