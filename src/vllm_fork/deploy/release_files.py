"""Release files beside a wheel (SBOM, provenance, notes) and publishing it.

``build`` writes, beside ``<wheel>``: ``<wheel>.cdx.json`` (CycloneDX SBOM),
``<wheel>.intoto.json`` (in-toto/SLSA provenance, DSSE-signed when a key is
given) and ``<wheel>.notes.md`` (release notes). ``verify`` checks the first
two against the wheel and the pins; ``publish`` requires both.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from vllm_fork import safejson
from vllm_fork.deploy import attestation, notes, sbom
from vllm_fork.errors import ForkError
from vllm_fork.hashing import sha256_file
from vllm_fork.probes import base_findings
from vllm_fork.series.forkversion import check_fork_version
from vllm_fork.sources.workspace import Workspace
from vllm_fork.wheel.builder import BuildResult
from vllm_fork.wheel.provenance import from_wheel
from vllm_fork.wheel.verify import Report, verify_wheel
from vllm_fork.wheel.wheelfile import Wheel

log = logging.getLogger(__name__)

SIGNING_KEY_ENV = "VLLM_FORK_SIGNING_KEY"
PUBLIC_KEY_ENV = "VLLM_FORK_PUBLIC_KEY"


def sidecar(wheel: Path, suffix: str) -> Path:
    return wheel.with_name(wheel.name + suffix)


@dataclass(frozen=True)
class ReleaseFiles:
    sbom: Path
    provenance: Path
    notes: Path


def previous_record(wheel: Path) -> dict[str, Any] | None:
    """The record of the newest older fork wheel of the same base beside ``wheel``."""
    _, version, _, _ = parse_wheel_filename(wheel.name)
    base, revision = check_fork_version(str(version))
    best: tuple[int, Path] | None = None
    for other in wheel.parent.glob("vllm-*.whl"):
        try:
            b, r = check_fork_version(str(parse_wheel_filename(other.name)[1]))
        except Exception:  # not a fork wheel
            continue
        if b == base and r < revision and (best is None or r > best[0]):
            best = (r, other)
    if best is None:
        return None
    with Wheel(best[1]) as w:
        return from_wheel(w)


def write_release_files(
    wheel: Path,
    record: dict[str, Any],
    environment: dict[str, str | None],
    *,
    sdist_url: str | None = None,
    signing_key: Path | None = None,
    findings: dict[str, Any] | None = None,
    base_findings: dict[str, Any] | None = None,
    previous: dict[str, Any] | None = None,
    known_issues: dict[str, dict[str, Any]] | None = None,
) -> ReleaseFiles:
    """Write the SBOM, the provenance statement and the release notes beside ``wheel``."""
    digest = sha256_file(wheel)
    key_path = signing_key or (
        Path(os.environ[SIGNING_KEY_ENV]) if os.environ.get(SIGNING_KEY_ENV) else None
    )
    key = attestation.load_private_key(key_path) if key_path else None
    files = ReleaseFiles(
        sidecar(wheel, sbom.SUFFIX),
        sidecar(wheel, attestation.SUFFIX),
        sidecar(wheel, notes.SUFFIX),
    )
    files.sbom.write_text(
        sbom.make_sbom(
            record,
            wheel_name=wheel.name,
            wheel_sha256=digest,
            environment=environment,
            sdist_url=sdist_url,
        ),
        encoding="utf-8",
    )
    statement = attestation.make_statement(
        record, wheel_name=wheel.name, wheel_sha256=digest, environment=environment
    )
    files.provenance.write_text(attestation.dumps(statement, key), encoding="utf-8")
    if previous is None:
        previous = previous_record(wheel)
    files.notes.write_text(
        notes.make_notes(
            record,
            wheel_name=wheel.name,
            wheel_sha256=digest,
            previous=previous,
            findings=findings,
            base_findings=base_findings,
            known_issues=known_issues,
        ),
        encoding="utf-8",
    )
    log.info(
        f"wrote {files.sbom.name}, {files.provenance.name} "
        f"({'signed' if key else 'unsigned'}) and {files.notes.name}"
    )
    return files


def check_release_files(
    wheel: Path,
    record: dict[str, Any],
    pins: dict[str, Any],
    *,
    public_key: Path | None = None,
    required: bool = False,
) -> tuple[list[str], list[str]]:
    """(ok lines, mismatch lines) for the SBOM and provenance beside ``wheel``.

    Absent files are a mismatch only when ``required``.
    """
    ok: list[str] = []
    bad: list[str] = []
    wheel = Path(wheel)
    digest = sha256_file(wheel)
    key_path = public_key or (
        Path(os.environ[PUBLIC_KEY_ENV]) if os.environ.get(PUBLIC_KEY_ENV) else None
    )
    for suffix, label in ((sbom.SUFFIX, "SBOM"), (attestation.SUFFIX, "provenance statement")):
        path = sidecar(wheel, suffix)
        if not path.is_file():
            (bad if required else ok).append(
                f"{label} {path.name}: not found beside the wheel (not checked)"
            )
            continue
        problem = _unreadable_json(path)
        if problem:
            bad.append(f"{label} {path.name}: {problem}")
            continue
        text = path.read_text(encoding="utf-8")
        if suffix == sbom.SUFFIX:
            problems = sbom.check_sbom(
                text, record=record, wheel_name=wheel.name, wheel_sha256=digest, pins=pins
            )
            what = f"SBOM {path.name} (CycloneDX, valid) matches the wheel, record and pins"
        else:
            key = attestation.load_public_key(key_path) if key_path else None
            problems, signing = attestation.check_attestation(
                text,
                record=record,
                wheel_name=wheel.name,
                wheel_sha256=digest,
                pins=pins,
                public_key=key,
            )
            what = f"provenance {path.name} subject and materials match ({signing})"
        if problems:
            bad += [f"{label} {path.name}: {p}" for p in problems]
        else:
            ok.append(what)
    return ok, bad


def _unreadable_json(path: Path) -> str | None:
    """Why the release file at ``path`` cannot be read as JSON within the limits
    (:mod:`vllm_fork.safejson`), or None (its size is checked before it is read)."""
    size = path.stat().st_size
    if size > safejson.MAX_BYTES:
        return f"{size} bytes, more than the {safejson.MAX_BYTES} a document may have"
    try:
        safejson.loads(path.read_bytes())
    except safejson.JSONLimitError as exc:
        return str(exc)
    return None


def sdist_source_url(config: Any, filename: str) -> str | None:
    """Where the configured index serves the sdist (None offline or when unreachable)."""
    if config.offline:
        return None
    try:
        return str(config.fetcher.locate(filename).package.url).split("#", 1)[0]
    except (ForkError, OSError) as exc:
        log.info(f"source URL of {filename} not recorded in the SBOM: {exc}")
        return None


def release_files(
    config: Any, result: BuildResult, *, signing_key: Path | None = None
) -> ReleaseFiles:
    """SBOM, provenance statement and notes beside a finished build's wheel (the
    CLI writes them after :func:`vllm_fork.wheel.builder.build`)."""
    return write_release_files(
        result.wheel,
        result.record,
        result.environment,
        sdist_url=sdist_source_url(config, result.record["base"]["sdist"]["filename"]),
        signing_key=signing_key,
        findings=result.findings,
        base_findings=base_findings(config, result.base),
        known_issues=result.known_issues,
    )


def verify_release(
    config: Workspace,
    wheel: Path,
    *,
    public_key: Path | None = None,
    require_release_files: bool = False,
    tree: Path | None = None,
) -> Report:
    """:func:`vllm_fork.wheel.verify.verify_wheel` and the release files beside the
    wheel (absent ones are a mismatch only when ``require_release_files``)."""

    def release_checks(
        path: Path, record: dict[str, Any], pins: dict[str, Any]
    ) -> tuple[list[str], list[str]]:
        return check_release_files(
            path, record, pins, public_key=public_key, required=require_release_files
        )

    return verify_wheel(config, wheel, tree=tree, also=release_checks)
