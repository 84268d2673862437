r"""The provenance record a fork wheel carries: ``vllm/_fork_provenance.json``.

The build writes it into the tree copy before vLLM's build runs, so it is a
file of the installed package and is covered by the wheel's RECORD. It
holds no time stamps: the same inputs give the same bytes.

Read it where the wheel is installed (vLLM itself is not imported)::

    python -m vllm_fork.provenance
    python -c "import importlib.util as u, pathlib as p; \
      d = u.find_spec('vllm').submodule_search_locations[0]; \
      print(p.Path(d, '_fork_provenance.json').read_text())"
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_fork import safejson
from vllm_fork.diffs import touched_paths
from vllm_fork.errors import ExitCode, ForkError
from vllm_fork.facts import registry
from vllm_fork.hashing import sha256_bytes
from vllm_fork.series.patches import BUILD_ANY, BUILD_FULL, ORIGIN_BACKPORT, origin_fields

if TYPE_CHECKING:
    from vllm_fork.series.patches import Series
    from vllm_fork.sources.pins import Base, RocmPin
    from vllm_fork.wheel.wheelfile import Wheel

SCHEMA = 1
PACKAGE_PATH = "vllm/_fork_provenance.json"


def upstream_pr(change: str, origin: str) -> str | None:
    """The PR of a ``backport, <url>[, commit:<sha>]`` origin, else the PR the
    change belongs to (from the change registry; None for support patches)."""
    category, url, _ = origin_fields(origin)
    if category == ORIGIN_BACKPORT:
        return url
    entry = registry.find(change)
    return entry.pr_url if entry is not None else None


class MalformedRecord(ValueError):
    """A schema-1 record with a missing or mistyped field."""


def _str(data: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> Any:
    value = data.get(key) if isinstance(data, Mapping) else None
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise MalformedRecord(f"{where}{key} is not a string")
    return value


def _table(data: Any, key: str, where: str) -> Mapping[str, Any]:
    value = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(value, Mapping):
        raise MalformedRecord(f"{where}{key} is not a table")
    return value


@dataclass(frozen=True)
class FileRef:
    """A file by name and sha256 (the pinned sdist, the reused upstream wheel)."""

    filename: str
    sha256: str

    def to_json(self) -> dict[str, str]:
        return {"filename": self.filename, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> FileRef:
        return cls(_str(data, "filename", where), _str(data, "sha256", where))


@dataclass(frozen=True)
class PatchEntry:
    """One patch of the series, as built."""

    file: str
    change: str
    part: str
    origin: str
    upstream_pr: str | None
    sha256: str
    paths: tuple[str, ...]
    build: str = BUILD_ANY  # its Fork-Build value

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "change": self.change,
            "part": self.part,
            "origin": self.origin,
            "upstream_pr": self.upstream_pr,
            "sha256": self.sha256,
            "paths": list(self.paths),
            "build": self.build,
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> PatchEntry:
        if not isinstance(data, Mapping):
            raise MalformedRecord(f"{where} is not a table")
        where += "."
        paths = data.get("paths", [])
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise MalformedRecord(f"{where}paths is not a list of paths")
        return cls(
            file=_str(data, "file", where),
            change=_str(data, "change", where),
            part=_str(data, "part", where, optional=True) or "change",
            origin=_str(data, "origin", where, optional=True) or "",
            upstream_pr=_str(data, "upstream_pr", where, optional=True),
            sha256=_str(data, "sha256", where),
            paths=tuple(paths),
            build=_str(data, "build", where, optional=True) or BUILD_ANY,
        )


@dataclass(frozen=True)
class LeftOut:
    """A patch of the series the build left out (``Fork-Build: full``, precompiled build)."""

    file: str
    change: str
    build: str
    sha256: str

    def to_json(self) -> dict[str, str]:
        return {
            "file": self.file,
            "change": self.change,
            "build": self.build,
            "sha256": self.sha256,
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> LeftOut:
        if not isinstance(data, Mapping):
            raise MalformedRecord(f"{where} is not a table")
        where += "."
        return cls(
            _str(data, "file", where),
            _str(data, "change", where),
            _str(data, "build", where),
            _str(data, "sha256", where),
        )


@dataclass(frozen=True)
class RocmBuild:
    """What a build on upstream's ROCm wheel is for (``build.rocm`` of the record)."""

    variant: str  # rocm700
    rocm: str  # the ROCm version the variant stands for
    python: str  # the Python tag of upstream's ROCm wheel (and of the fork wheel)
    aiter: str | None  # the AITER tag the base's ROCm image pins (docker/Dockerfile.rocm_base)

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "rocm_version": self.rocm,
            "python": self.python,
            "aiter": self.aiter,
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> RocmBuild:
        if not isinstance(data, Mapping):
            raise MalformedRecord(f"{where} is not a table")
        where += "."
        return cls(
            _str(data, "variant", where),
            _str(data, "rocm_version", where),
            _str(data, "python", where),
            _str(data, "aiter", where, optional=True),
        )


@dataclass(frozen=True)
class Provenance:
    """The record of one build (``vllm/_fork_provenance.json``, schema 1)."""

    version: str
    base_version: str
    sdist: FileRef
    upstream_wheel: FileRef | None  # only when the build reused upstream's binaries
    mode: str
    device: str
    revision: int
    patches: tuple[PatchEntry, ...]
    tool_version: str
    tool_name: str = "vllm-fork"
    schema: int = SCHEMA
    offline: bool | None = None  # build.offline: written by builds that know it
    from_upstream_wheel: tuple[str, ...] = ()  # files taken as upstream's wheel has them
    left_out: tuple[LeftOut, ...] = ()  # patches of the series the build left out
    rocm: RocmBuild | None = None  # a build on upstream's ROCm wheel

    def to_json(self) -> dict[str, Any]:
        """The record's JSON object (the on-disk layout of schema 1)."""
        base: dict[str, Any] = {
            "version": self.base_version,
            "sdist": self.sdist.to_json(),
            "upstream_wheel": self.upstream_wheel.to_json() if self.upstream_wheel else None,
        }
        if self.from_upstream_wheel:
            base["from_upstream_wheel"] = list(self.from_upstream_wheel)
        build: dict[str, Any] = {"mode": self.mode, "device": self.device}
        if self.offline is not None:
            build["offline"] = self.offline
        if self.rocm is not None:
            build["rocm"] = self.rocm.to_json()
        return {
            "schema": self.schema,
            "tool": {"name": self.tool_name, "version": self.tool_version},
            "version": self.version,
            "base": base,
            "build": build,
            "series": {
                "revision": self.revision,
                "patches": [p.to_json() for p in self.patches],
                "left_out": [p.to_json() for p in self.left_out],
            },
        }

    @classmethod
    def from_json(cls, data: Any) -> Provenance:
        """Read a record; ValueError when it is not a schema-1 record."""
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a fork provenance record of schema {SCHEMA}")
        tool = data.get("tool") or {}
        base = _table(data, "base", "")
        build = _table(data, "build", "")
        series = _table(data, "series", "")
        wheel = base.get("upstream_wheel")
        revision = series.get("revision")
        patches = series.get("patches")
        if not isinstance(revision, int) or isinstance(revision, bool):
            raise MalformedRecord("series.revision is not a number")
        if not isinstance(patches, list):
            raise MalformedRecord("series.patches is not a list")
        offline = build.get("offline")
        if offline is not None and not isinstance(offline, bool):
            raise MalformedRecord("build.offline is not true or false")
        left_out = series.get("left_out", [])
        if not isinstance(left_out, list):
            raise MalformedRecord("series.left_out is not a list")
        aligned = base.get("from_upstream_wheel", [])
        if not isinstance(aligned, list) or not all(isinstance(p, str) for p in aligned):
            raise MalformedRecord("base.from_upstream_wheel is not a list of paths")
        return cls(
            version=_str(data, "version", ""),
            base_version=_str(base, "version", "base."),
            sdist=FileRef.from_json(_table(base, "sdist", "base."), "base.sdist."),
            upstream_wheel=FileRef.from_json(wheel, "base.upstream_wheel.")
            if wheel is not None
            else None,
            mode=_str(build, "mode", "build."),
            device=_str(build, "device", "build."),
            revision=revision,
            patches=tuple(
                PatchEntry.from_json(p, f"series.patches[{i}]") for i, p in enumerate(patches)
            ),
            tool_version=_str(tool, "version", "tool.", optional=True) or "",
            tool_name=_str(tool, "name", "tool.", optional=True) or "vllm-fork",
            schema=SCHEMA,
            offline=offline,
            from_upstream_wheel=tuple(aligned),
            left_out=tuple(
                LeftOut.from_json(p, f"series.left_out[{i}]") for i, p in enumerate(left_out)
            ),
            rocm=RocmBuild.from_json(build["rocm"], "build.rocm")
            if build.get("rocm") is not None
            else None,
        )


def patch_entries(series: Series) -> tuple[PatchEntry, ...]:
    """One entry per patch, in series order."""
    entries = []
    for path, header in zip(series.patches, series.headers, strict=True):
        data = path.read_bytes()
        entries.append(
            PatchEntry(
                file=path.name,
                change=header.change,
                part=header.part,
                origin=header.origin,
                upstream_pr=upstream_pr(header.change, header.origin),
                sha256=sha256_bytes(data),
                paths=tuple(touched_paths(data.decode("utf-8", errors="replace"))),
                build=header.build,
            )
        )
    return tuple(entries)


def left_out_entries(series: Series, left_out: Collection[str]) -> tuple[LeftOut, ...]:
    """One entry per patch the build left out (``Fork-Build: full`` in a precompiled build)."""
    return tuple(
        LeftOut(path.name, header.change, header.build, sha256_bytes(path.read_bytes()))
        for path, header in zip(series.patches, series.headers, strict=True)
        if path.name in left_out
    )


def left_out_files(record: Provenance) -> list[str]:
    """The file names of the patches a wheel's build left out (none for older records)."""
    return [out.file for out in record.left_out]


def make_record(
    *,
    base: Base,
    series: Series,
    version: str,
    revision: int,
    mode: str,
    device: str,
    tool_version: str,
    left_out: Collection[str] = (),
    rocm: RocmPin | None = None,
    aiter: str | None = None,
) -> Provenance:
    """The record for a build of ``base`` + ``series`` (upstream wheel only when reused);
    ``left_out``: file names of the series' patches the build leaves out. ``patches``
    lists what the wheel holds, ``left_out`` what it lacks (each with its change id).
    ``rocm``: the pinned upstream ROCm wheel a precompiled ``--device rocm`` build reuses
    (it is then the record's upstream wheel), ``aiter`` the AITER tag of the base's ROCm
    image."""
    wheel = None
    rocm_build = None
    if mode == "precompiled" and rocm is not None:
        wheel = FileRef(rocm.filename, rocm.sha256)
        rocm_build = RocmBuild(rocm.variant, rocm.rocm, rocm.python, aiter)
    elif mode == "precompiled" and base.wheel is not None:
        wheel = FileRef(base.wheel.filename, base.wheel.sha256)
    return Provenance(
        version=version,
        base_version=base.version,
        sdist=FileRef(base.sdist.filename, base.sdist.sha256),
        upstream_wheel=wheel,
        mode=mode,
        device=device,
        revision=revision,
        patches=patch_entries(series.without(left_out)),
        tool_version=tool_version,
        left_out=left_out_entries(series, left_out),
        rocm=rocm_build,
    )


def dumps(record: Provenance | Mapping[str, Any]) -> str:
    """The record's bytes on disk: sorted keys, no time stamps (same inputs, same bytes)."""
    data = record.to_json() if isinstance(record, Provenance) else record
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_into_tree(tree: Path, record: Provenance) -> Path:
    path = Path(tree) / PACKAGE_PATH
    path.write_text(dumps(record), encoding="utf-8")
    return path


def parse(text: str | bytes) -> Provenance:
    """The typed record of a ``_fork_provenance.json``; ValueError when it is not one
    (the JSON is read within :mod:`vllm_fork.safejson`'s size and depth limits)."""
    return Provenance.from_json(safejson.loads(text))


def loads(text: str | bytes) -> dict[str, Any]:
    """The record's JSON object, checked to be a readable schema-1 record."""
    record = safejson.loads(text)
    Provenance.from_json(record)
    return record


class ProvenanceError(ForkError):
    """A wheel without a readable provenance record."""


def from_wheel(wheel: Wheel) -> dict[str, Any]:
    """The checked JSON object of ``wheel``'s record; ProvenanceError when it has none or
    it is malformed (too large, too deep, not UTF-8, not schema 1)."""
    if not wheel.has(PACKAGE_PATH):
        raise ProvenanceError(f"{wheel.path.name} has no {PACKAGE_PATH}: not a fork build")
    try:
        return loads(wheel.read(PACKAGE_PATH))
    except ValueError as exc:
        raise ProvenanceError(
            f"{wheel.path.name}: unreadable provenance record {PACKAGE_PATH} ({exc})"
        ) from None


def installed_path() -> Path | None:
    """The record of the ``vllm`` package importable here, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / Path(PACKAGE_PATH).name
        if candidate.is_file():
            return candidate
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_fork.provenance",
        description="Print the provenance record of the installed fork build of vLLM.",
    )
    parser.add_argument("--json", action="store_true", help="print the raw record")
    args = parser.parse_args(argv)
    path = installed_path()
    if path is None:
        print(
            "no fork provenance: vllm is not installed here or is not a fork build", file=sys.stderr
        )
        return ExitCode.FAILED
    text = path.read_text(encoding="utf-8")
    try:
        record = parse(text)
    except ValueError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    if args.json:
        print(dumps(json.loads(text)), end="")  # the record as written, keys sorted
        return ExitCode.OK
    print(format_record(record, source=str(path)))
    return ExitCode.OK


def format_record(record: Provenance, source: str | None = None) -> str:
    wheel = record.upstream_wheel
    lines = []
    if source:
        lines.append(f"provenance: {source}")
    lines += [
        f"version:  {record.version}",
        f"base:     vLLM {record.base_version} ({record.sdist.filename} "
        f"sha256 {record.sdist.sha256})",
        f"binaries: {wheel.filename} sha256 {wheel.sha256}"
        if wheel
        else "binaries: built from source"
        if record.mode == "full"
        else "binaries: none (pure Python build)",
        f"build:    mode {record.mode}, device {record.device}, "
        + ("offline, " if record.offline else "")
        + f"vllm-fork {record.tool_version}",
        *(
            [
                f"rocm:     {record.rocm.variant} (ROCm {record.rocm.rocm}, "
                f"{record.rocm.python}), AITER {record.rocm.aiter or 'not pinned by the base'}"
            ]
            if record.rocm
            else []
        ),
        *(
            [f"upstream wheel's version of: {', '.join(record.from_upstream_wheel)}"]
            if record.from_upstream_wheel
            else []
        ),
        f"series:   revision {record.revision}, {len(record.patches)} patch(es)",
    ]
    for p in record.patches:
        lines.append(
            f"  {p.file}  [{p.change}/{p.part}]  {p.upstream_pr or '-'}  sha256 {p.sha256[:16]}"
            + ("  (full build only)" if p.build == BUILD_FULL else "")
        )
    for out in record.left_out:
        lines.append(
            f"  left out: {out.file}  [{out.change}]  Fork-Build: {out.build} "
            "(not in this build: a precompiled wheel cannot carry it)"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
