"""One release-check report out of per-base results (a CI job per base or shard).

``vllm-fork release-check --out-dir DIR`` writes ``DIR/<V>.json`` for each
base it checks: the base's whole recorded state (every step with its figures
and whatever fields the tool records) and whether it was taken from an
earlier run. :func:`merge_results` reads any set of such files and builds the
report one run over the same bases writes. A base that should have a result
and has none is reported missing (the report fails); a result checked with
another series than this checkout's, or against another sdist pin, is refused:
it belongs to another commit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.version import Version

from vllm_fork.errors import UsageError
from vllm_fork.release.check import (
    KIND,
    RESULT_SCHEMA,
    BaseState,
    Report,
    _series_digest,
    select_bases,
)
from vllm_fork.sources.workspace import Workspace

log = logging.getLogger(__name__)


def _result_files(paths: Sequence[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.glob("*.json") if not p.name.startswith("."))
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"{path}: no such result file or directory")
    return files


def _load(path: Path) -> dict[str, Any] | None:
    """The result in ``path``; None for a JSON file that is not one (a merged
    report beside the results, say)."""
    try:
        data = json.loads(path.read_text())
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not a release-check result (not text)") from exc
    except ValueError as exc:
        raise UsageError(f"{path}: not a release-check result ({exc})") from exc
    if not isinstance(data, dict) or data.get("kind") != KIND:
        return None
    if data.get("schema") != RESULT_SCHEMA:
        raise UsageError(
            f"{path}: release-check result schema {data.get('schema')!r}; this tool reads "
            f"{RESULT_SCHEMA}"
        )
    return data


def _short(digest: Any) -> str:
    return str(digest)[:12] if digest else "none (no series)"


def merge_results(
    config: Workspace, paths: Sequence[Path], bases: Sequence[str] | None = None
) -> Report:
    """The report of the results in ``paths`` (files, or directories of
    ``<V>.json``); ``bases`` (default: every base release-check checks) are
    the bases expected, and those without a result are missing."""
    pins = config.pins
    expected = select_bases(config, pins, bases)
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in _result_files(paths):
        data = _load(path)
        if data is None:
            log.info("%s is not a per-base release-check result; left out", path)
            continue
        try:
            state = BaseState.from_json(data["state"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"{path}: a damaged release-check result ({exc!r})") from exc
        version = state.version
        base = pins.get(version)  # a release bases.toml does not pin: usage error
        series = _series_digest(config, version)
        if state.inputs.get("series") != series:
            raise UsageError(
                f"{path}: the result of {version} was checked with another series "
                f"(digest {_short(state.inputs.get('series'))}, series/{version} here is "
                f"{_short(series)}); merge the results of one commit"
            )
        if state.inputs.get("sdist") != base.sdist.sha256:
            raise UsageError(
                f"{path}: the result of {version} was checked against another sdist pin "
                "than bases.toml's; merge the results of one commit"
            )
        if version in found and found[version][1] != data:
            raise UsageError(f"two different results of {version}: {found[version][0]} and {path}")
        found[version] = (path, data)
    order = sorted(found, key=Version)
    states = [BaseState.from_json(found[v][1]["state"]) for v in order]
    reused = {v for v in order if found[v][1].get("reused")}
    # the shards ran side by side: the slowest one is the wall time
    seconds = max((float(found[v][1].get("run_seconds") or 0) for v in order), default=0.0)
    missing = [v for v in expected if v not in found]
    return Report(states, reused, seconds, missing=missing)
