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
