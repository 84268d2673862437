"""Helpers to read and edit a test repository's series through the store
(series/store.py): tests name patches as `git format-patch` names them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from vllm_fork.series import store


def series_files(directory: Path) -> dict[str, bytes]:
    """Base ``directory`` (series/<V>) as the files it stands for: each patch by
    its series name (``0001-<stem>.patch``), and the directory's own files
    (``series``, ``revision``)."""
    out = (
        {p.name: p.read_bytes() for p in sorted(directory.iterdir())} if directory.is_dir() else {}
    )
    base = store.read_base(directory.parent, directory.name)
    if base is not None:
        out.update(zip(base.names, base.contents, strict=True))
    return out


def logical_files(root: Path) -> dict[str, bytes]:
    """:func:`series_files` of every base under ``root`` (series/), as "V/name"."""
    out: dict[str, bytes] = {}
    if root.is_dir():
        for directory in sorted(p for p in root.iterdir() if p.name != store.POOL_DIR):
            out.update({f"{directory.name}/{n}": d for n, d in series_files(directory).items()})
    return out


def stored_patch(directory: Path, name: str) -> Path:
    """The pool file of the patch ``name`` (``0001-<stem>.patch``) of base ``directory``."""
    base = store.read_base(directory.parent, directory.name)
    assert base is not None, directory
    return directory.parent / store.POOL_DIR / base.pool_names[base.names.index(name)]


def patch_names(directory: Path) -> list[str]:
    base = store.read_base(directory.parent, directory.name)
    return base.names if base is not None else []


def edit_stored(directory: Path, name: str, edit: Callable[[bytes], bytes]) -> None:
    """Change the patch ``name`` of base ``directory`` as a writer of the store would."""
    base = store.read_base(directory.parent, directory.name)
    assert base is not None, directory
    at = base.names.index(name)
    base.contents[at] = edit(base.contents[at])
    store.update_base(directory.parent, directory.name, base)


def tree_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, by its path relative to it."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
