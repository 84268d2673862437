"""Upstream's ROCm wheel of a base: choose it from an index the user names and pin it.

Upstream publishes ROCm wheels outside PyPI, one per release and ROCm variant,
named ``vllm-<version>+rocm<NNN>-cp312-cp312-manylinux_<...>_x86_64.whl``
(``NNN``: the first three digits of the ROCm version). vLLM's own precompiled
ROCm path reads such an index and takes the last wheel listed for the
machine's architecture, whatever its version; here the wheel is chosen once,
by version, Python tag and variant, and pinned by sha256 in bases.toml
(:class:`~vllm_fork.sources.pins.RocmPin`). A build then hands exactly that
file to vLLM's build (``VLLM_PRECOMPILED_WHEEL_LOCATION``).

Sources (``vllm-fork pin V --rocm-index SRC`` or ``--rocm-wheel FILE``):

- an ``http(s)://`` or ``file://`` PEP 503 simple index (upstream's or a
  mirror); its page of ``vllm`` must give each file's sha256;
- a local directory: a PEP 503 tree (``vllm/index.html``) or a flat directory
  of wheels (hashed here; they are the user's files);
- one wheel file.

A wheel pinned from a local file is copied into the verified download cache
at once (the build finds it there); one pinned from an index is downloaded
by the build and checked against the pin.
"""

from __future__ import annotations

import copy
import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse
from urllib.request import url2pathname

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from vllm_fork.atomic import place_file
from vllm_fork.errors import HashMismatchError, NotOnIndexError, UsageError
from vllm_fork.hashing import sha256_file
from vllm_fork.lock import cache_lock, owned_tempfile
from vllm_fork.sources.fetch import PROJECT, Fetcher, Index, _redact
from vllm_fork.sources.pins import (
    Pins,
    RocmPin,
    check_version,
    rocm_version_of,
    save_pins,
)

if TYPE_CHECKING:
    from vllm_fork.sources.workspace import Workspace

log = logging.getLogger(__name__)

DEFAULT_PYTHON = "cp312"  # the only Python upstream publishes ROCm wheels for


class RocmPinError(UsageError):
    """No ROCm wheel (or more than one) fits what was asked."""


@dataclass(frozen=True)
class Candidate:
    """One ROCm wheel file found at the source."""

    filename: str
    version: str  # the public version (without +rocmNNN)
    variant: str  # rocmNNN
    python: str  # the Python tag(s), e.g. cp312
    build: tuple[int, str] | tuple[()]
    sha256: str | None  # from the index page, or computed for a local file
    url: str | None = None
    path: Path | None = None


def parse_candidate(
    filename: str, sha256: str | None = None, url: str | None = None, path: Path | None = None
) -> Candidate | None:
    """A ROCm wheel of vLLM for x86_64 Linux, or None for any other file."""
    try:
        name, version, build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    if name != PROJECT or version.local is None or rocm_version_of(version.local) is None:
        return None
    if not any(t.platform.startswith("manylinux") and t.platform.endswith("_x86_64") for t in tags):
        return None
    python = ".".join(sorted({t.interpreter for t in tags}))
    return Candidate(filename, version.public, version.local, python, build, sha256, url, path)


def _index_candidates(url: str, config: Workspace, fetcher: Fetcher) -> list[Candidate]:
    index = Index(url, fetcher.pip)
    packages = index.packages(PROJECT)
    if packages is None:
        raise NotOnIndexError(f"the index {index.display} has no page for {PROJECT}")
    found = []
    for pkg in packages:
        c = parse_candidate(pkg.filename, pkg.digests.get("sha256"), url=pkg.url)
        if c is not None:
            found.append(c)
    return found


def _dir_candidates(directory: Path) -> list[Candidate]:
    found = []
    for path in sorted(directory.glob("*.whl")):
        c = parse_candidate(path.name, path=path)
        if c is not None:
            found.append(c)
    return found


def _listing(cands: list[Candidate]) -> str:
    return ", ".join(sorted(c.filename for c in cands)) or "none"


def choose(
    cands: list[Candidate], version: str, *, python: str, variant: str | None, where: str
) -> Candidate:
    """The one wheel of ``version`` for ``python`` and ``variant``; RocmPinError (one line,
    naming what is available) when there is none or the choice is ambiguous."""
    if variant is not None and rocm_version_of(variant) is None:
        raise RocmPinError(f"--rocm-variant {variant!r} is not a ROCm variant such as rocm700")
    of_version = [c for c in cands if Version(c.version) == Version(version)]
    if not of_version:
        versions = sorted({c.version for c in cands}, key=Version)
        raise RocmPinError(
            f"no ROCm wheel of vLLM {version} at {where}; it has ROCm wheels of "
            f"{', '.join(versions) or 'no version'} ({_listing(cands)})"
        )
    of_python = [c for c in of_version if python in c.python.split(".")]
    if not of_python:
        raise RocmPinError(
            f"no {python} ROCm wheel of vLLM {version} at {where}; available for {version}: "
            f"{_listing(of_version)} (pass --rocm-python TAG to pin another Python)"
        )
    variants = sorted({c.variant for c in of_python})
    if variant is None:
        if len(variants) > 1:
            raise RocmPinError(
                f"{where} has several ROCm variants of vLLM {version} for {python} "
                f"({', '.join(variants)}): choose one with --rocm-variant"
            )
        variant = variants[0]
    chosen = [c for c in of_python if c.variant == variant]
    if not chosen:
        raise RocmPinError(
            f"no {variant} wheel of vLLM {version} for {python} at {where}; available "
            f"variants: {', '.join(variants)}"
        )
    # several builds of one variant: the highest build tag, as pip would choose
    return max(chosen, key=lambda c: (c.build, c.filename))


def _store_local(config: Workspace, path: Path, digest: str) -> None:
    """Copy a local wheel into the download cache (``dist/``), checked against ``digest``."""
    with cache_lock(config.cache_dir):
        target = config.dist_dir / path.name
        if target.is_file() and sha256_file(target) == digest:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = owned_tempfile(config.tmp_dir, path.name)
        try:
            shutil.copyfile(path, tmp)
            if sha256_file(tmp) != digest:
                raise NotOnIndexError(f"{path} changed while it was being pinned")
            place_file(tmp, target, shared=True)
        finally:
            tmp.unlink(missing_ok=True)


def pin_rocm(
    config: Workspace,
    fetcher: Fetcher,
    version: str,
    *,
    index: str | None = None,
    wheel: Path | None = None,
    python: str = DEFAULT_PYTHON,
    variant: str | None = None,
) -> tuple[Pins, RocmPin]:
    """Record upstream's ROCm wheel of the pinned base ``version`` in bases.toml."""
    version = check_version(version)
    pins = copy.deepcopy(config.pins)  # edited, then written
    base = pins.get(version)
    if (index is None) == (wheel is None):
        raise UsageError("pin a ROCm wheel from one source: --rocm-index URL|DIR or --rocm-wheel")
    recorded_index: str | None = None
    if wheel is not None:
        wheel = Path(wheel)
        if not wheel.is_file():
            raise UsageError(f"--rocm-wheel {wheel}: no such file")
        cand = parse_candidate(wheel.name, path=wheel)
        if cand is None:
            raise RocmPinError(
                f"{wheel.name} is not a ROCm wheel of vLLM for x86_64 Linux "
                "(vllm-<version>+rocm<NNN>-<python>-<abi>-manylinux_*_x86_64.whl)"
            )
        cands, where = [cand], str(wheel)
    else:
        assert index is not None
        local = Path(index).expanduser()
        if "://" not in index and local.is_dir():
            if (local / PROJECT / "index.html").is_file():
                cands, where = _index_candidates(local.resolve().as_uri(), config, fetcher), index
            else:
                cands, where = _dir_candidates(local), index
        elif urlparse(index).scheme in ("http", "https", "file"):
            if config.offline:
                raise UsageError("offline mode is on: the ROCm index cannot be read")
            cands, where = _index_candidates(index, config, fetcher), _redact(index)
            if urlparse(index).scheme != "file":
                recorded_index = _redact(index)
        else:
            raise UsageError(f"--rocm-index {index}: not a URL or a directory")
    chosen = choose(cands, version, python=python, variant=variant, where=where)
    digest = chosen.sha256
    if chosen.path is not None:
        digest = sha256_file(chosen.path)
        _store_local(config, chosen.path, digest)
    elif not digest:
        raise NotOnIndexError(
            f"{where} gives no sha256 for {chosen.filename}: download it, check it and pin it "
            "with --rocm-wheel FILE"
        )
    elif chosen.url and urlparse(chosen.url).scheme == "file":
        path = Path(url2pathname(urlparse(chosen.url).path))
        if sha256_file(path) != digest:
            raise NotOnIndexError(
                f"{chosen.filename} at {where} does not match the sha256 its index gives"
            )
        _store_local(config, path, digest)
    rocm = rocm_version_of(chosen.variant)
    assert rocm is not None
    pin = RocmPin(chosen.variant, chosen.filename, digest, rocm, python, recorded_index)
    others = tuple(p for p in base.rocm if p.variant != pin.variant)
    pins.bases[version] = replace(base, rocm=tuple(sorted((*others, pin), key=lambda p: p.variant)))
    save_pins(config.bases_file, pins)
    log.info(f"pinned {chosen.filename} ({pin.variant}, ROCm {rocm}, {python}) for {version}")
    return pins, pin


def ensure_rocm_wheel(
    config: Workspace, pin: RocmPin, index: str | None = None, fetcher: Fetcher | None = None
) -> Path:
    """The pinned ROCm wheel, verified, from the cache or downloaded from ``index`` (else the
    index it was pinned from)."""
    where = index or pin.index
    cached = config.dist_dir / pin.filename
    if where is None and not cached.is_file():
        raise UsageError(
            f"{pin.filename} (pinned from a local file) is not in the download cache: pin it "
            "again with `vllm-fork pin V --rocm-wheel FILE`, or pass --rocm-index URL|DIR"
        )
    if where is not None and "://" not in where and Path(where).is_dir():
        local = Path(where)
        where = local.resolve().as_uri() if (local / "vllm" / "index.html").is_file() else None
        if where is None and not cached.is_file():
            src = local / pin.filename
            if not src.is_file():
                raise UsageError(f"{pin.filename} is not in {local}")
            if sha256_file(src) != pin.sha256:
                raise HashMismatchError(
                    f"sha256 mismatch for {pin.filename} in {local}: expected {pin.sha256}"
                )
            _store_local(config, src, pin.sha256)
    return (fetcher or config.fetcher).ensure(pin.file, index=where)
