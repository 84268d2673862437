"""`vllm-fork release-notes`: a wheel's notes, with the known-issue states of its
base and series as `status` computes them (the Markdown itself: deploy/notes.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from vllm_fork.deploy.notes import make_notes
from vllm_fork.deploy.publish import previous_published
from vllm_fork.deploy.release_files import previous_record
from vllm_fork.errors import ForkError, UsageError
from vllm_fork.hashing import sha256_file
from vllm_fork.reports.status import compute_status
from vllm_fork.sources.workspace import Workspace
from vllm_fork.wheel.provenance import from_wheel
from vllm_fork.wheel.wheelfile import Wheel

log = logging.getLogger(__name__)


def record_of(path: Path) -> dict[str, Any]:
    """The provenance record of the fork wheel ``path``."""
    try:
        with Wheel(path) as w:
            return from_wheel(w)
    except ForkError as exc:
        raise UsageError(f"{path}: not a fork wheel with a provenance record ({exc})") from None


def known_issues_of(config: Workspace, record: dict[str, Any]) -> dict[str, Any] | None:
    """The known-issue states of the wheel's base and series, as ``status`` computes
    them; None (the notes say "not judged") when the wheel was built from another
    series than the repository holds now for its base, or the base cannot be probed here."""
    version = record["base"]["version"]
    try:
        series = config.series(version)
        now = {p.name: sha256_file(p) for p in series.patches}
        built = {p["file"]: p["sha256"] for p in record["series"]["patches"]}
        if any(now.get(name) != digest for name, digest in built.items()):
            return None
        report = compute_status(config, version)
    except (ForkError, KeyError, TypeError, OSError) as exc:
        log.info("known issues not judged for the notes: %s", exc)
        return None
    return {s.issue: s.to_json() for s in report.known_issues}


def wheel_notes(
    config: Workspace,
    wheel: Path,
    *,
    previous: Path | None = None,
    index_url: str | None = None,
) -> str:
    """The release notes of ``wheel`` (Markdown), against the record of ``previous``,
    else the newest older wheel published at ``index_url``, else the newest older
    wheel beside it."""
    record = record_of(wheel)
    before: dict[str, Any] | None
    if previous is not None:
        before = record_of(previous)
    elif index_url:
        before = previous_published(record["version"], index_url)
    else:
        before = previous_record(wheel)
    return make_notes(
        record,
        wheel_name=wheel.name,
        wheel_sha256=sha256_file(wheel),
        previous=before,
        known_issues=known_issues_of(config, record),
    )
