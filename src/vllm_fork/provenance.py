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
import hashlib
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_fork.series.patches import Series
    from vllm_fork.sources.pins import Base

SCHEMA = 1
PACKAGE_PATH = "vllm/_fork_provenance.json"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upstream_pr(change: str, origin: str) -> str | None:
    """The PR of a ``backport, <url>`` origin, else the PR the change belongs to
    (from the change registry; None for support patches)."""
    from vllm_fork.changes import registry

    if origin.startswith("backport,"):
        return origin.split(",", 1)[1].strip() or None
    entry = registry.find(change)
    return entry.pr_url if entry is not None else None


def patch_entries(series: Series) -> list[dict[str, Any]]:
    """One entry per patch, in series order."""
    from vllm_fork.build.rules import touched_paths

    entries = []
    for path, header in zip(series.patches, series.headers, strict=True):
        data = path.read_bytes()
        entries.append(
            {
                "file": path.name,
                "change": header.change,
                "part": header.part,
                "origin": header.origin,
                "upstream_pr": upstream_pr(header.change, header.origin),
                "sha256": sha256_bytes(data),
                "paths": touched_paths(data.decode("utf-8", errors="replace")),
            }
        )
    return entries


def make_record(
    *,
    base: Base,
    series: Series,
    version: str,
    revision: int,
    mode: str,
    device: str,
    tool_version: str,
) -> dict[str, Any]:
    """The record for a build of ``base`` + ``series`` (upstream wheel only when reused)."""
    wheel = None
    if mode == "precompiled" and base.wheel is not None:
        wheel = {"filename": base.wheel.filename, "sha256": base.wheel.sha256}
    return {
        "schema": SCHEMA,
        "tool": {"name": "vllm-fork", "version": tool_version},
        "version": version,
        "base": {
            "version": base.version,
            "sdist": {"filename": base.sdist.filename, "sha256": base.sdist.sha256},
            "upstream_wheel": wheel,
        },
        "build": {"mode": mode, "device": device},
        "series": {"revision": revision, "patches": patch_entries(series)},
    }


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


def write_into_tree(tree: Path, record: dict[str, Any]) -> Path:
    path = Path(tree) / PACKAGE_PATH
    path.write_text(dumps(record), encoding="utf-8")
    return path


def loads(text: str | bytes) -> dict[str, Any]:
    record = json.loads(text)
    if not isinstance(record, dict) or record.get("schema") != SCHEMA:
        raise ValueError(f"not a fork provenance record of schema {SCHEMA}")
    return record


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
        return 1
    record = loads(path.read_text(encoding="utf-8"))
    if args.json:
        print(dumps(record), end="")
        return 0
    print(format_record(record, source=str(path)))
    return 0


def format_record(record: dict[str, Any], source: str | None = None) -> str:
    base = record["base"]
    wheel = base.get("upstream_wheel")
    lines = []
    if source:
        lines.append(f"provenance: {source}")
    lines += [
        f"version:  {record['version']}",
        f"base:     vLLM {base['version']} ({base['sdist']['filename']} "
        f"sha256 {base['sdist']['sha256']})",
        f"binaries: {wheel['filename']} sha256 {wheel['sha256']}"
        if wheel
        else "binaries: built from source"
        if record["build"]["mode"] == "full"
        else "binaries: none (pure Python build)",
        f"build:    mode {record['build']['mode']}, device {record['build']['device']}, "
        f"vllm-fork {record['tool']['version']}",
        f"series:   revision {record['series']['revision']}, "
        f"{len(record['series']['patches'])} patch(es)",
    ]
    for p in record["series"]["patches"]:
        lines.append(
            f"  {p['file']}  [{p['change']}/{p['part']}]  {p['upstream_pr'] or '-'}  "
            f"sha256 {p['sha256'][:16]}"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
