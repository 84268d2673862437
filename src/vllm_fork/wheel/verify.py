"""`vllm-fork verify WHEEL`: does a wheel hold exactly what the series and pins say?

Checks, each reported as one line:
- every member matches its RECORD hash and size, and RECORD lists every member;
  each finding of :meth:`~vllm_fork.wheel.wheelfile.Wheel.check` (a malformed
  RECORD row, an unsafe member name, a link or device member, a zip bomb, a
  damaged member) is one line naming the member;
- the provenance record is present and well formed;
- the version in the file name, METADATA, ``vllm/_version.py`` and the record agree,
  and is ``<base>+hardened.<revision of the current series>``;
- the base is pinned, with the recorded sdist (and upstream wheel) sha256;
- the recorded patches are the current series: same files, order, headers and sha256;
  the patches the record says the build left out are exactly those a build of its
  mode leaves out (``Fork-Build: full`` in a precompiled build), and the version
  label says so (``.nofull``) exactly when the record lists any;
- the SBOM and provenance statement beside the wheel (when there, or when required)
  describe this wheel, its record and the pins (:mod:`vllm_fork.deploy`);
- every member that differs from upstream's wheel is explained (`vllm-fork audit`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork.errors import ForkError
from vllm_fork.probes.rocm_pins import base_aiter
from vllm_fork.series.forkversion import (
    NOFULL,
    fork_version,
    leaves_out,
    rocm_variant,
    series_revision,
)
from vllm_fork.series.precompiled import left_out_of
from vllm_fork.sources.workspace import Workspace
from vllm_fork.wheel.audit import NoBaselineError, audit_wheel
from vllm_fork.wheel.provenance import (
    PACKAGE_PATH,
    MalformedRecord,
    PatchEntry,
    left_out_files,
    make_record,
    parse,
)
from vllm_fork.wheel.wheelfile import Wheel, WheelError, format_findings

_VERSION_PY = re.compile(r"^__version__ = version = ['\"]([^'\"]+)['\"]", re.MULTILINE)


@dataclass
class Report:
    ok: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    # the wheel's record and the pinned base as a record gives it (for the release files)
    record: dict[str, Any] | None = None
    expected_base: dict[str, Any] | None = None

    def check(self, good: bool, what: str, why: str = "") -> bool:
        if good:
            self.ok.append(what)
        else:
            self.bad.append(f"{what}: {why}" if why else what)
        return good

    @property
    def passed(self) -> bool:
        return not self.bad

    def format(self) -> str:
        lines = [f"ok        {line}" for line in self.ok]
        lines += [f"MISMATCH  {line}" for line in self.bad]
        lines.append("verify: " + ("passed" if self.passed else f"FAILED ({len(self.bad)})"))
        return "\n".join(lines)


def _compare_patches(
    report: Report, recorded: Sequence[PatchEntry], expected: Sequence[PatchEntry]
) -> None:
    rec_files = [p.file for p in recorded]
    exp_files = [p.file for p in expected]
    if rec_files != exp_files:
        report.check(
            False,
            "series patches",
            f"wheel has {rec_files or 'none'}, series has {exp_files or 'none'}",
        )
        return
    for rec, exp in zip(recorded, expected, strict=True):
        diffs = [
            k
            for k in ("change", "part", "origin", "upstream_pr", "sha256", "paths", "build")
            if getattr(rec, k) != getattr(exp, k)
        ]
        report.check(
            not diffs,
            f"patch {exp.file}",
            "differs from the series in " + ", ".join(diffs),
        )
    if not expected:
        report.ok.append("series patches: none (pristine base)")


# A further check of the wheel, given its record and the pinned base as a record
# gives it: (ok lines, mismatch lines). The release files beside the wheel are
# checked this way (vllm_fork.deploy.release_files.verify_release), above this layer.
RecordCheck = Callable[[Path, dict[str, Any], dict[str, Any]], tuple[list[str], list[str]]]


def verify_wheel(
    config: Workspace,
    wheel_path: Path,
    *,
    tree: Path | None = None,
    also: RecordCheck | None = None,
) -> Report:
    """Check ``wheel_path``; ``tree``: a materialization of its base + series to reuse;
    ``also``: a further check run before the delta audit."""
    report = Report()
    try:
        _verify(config, Path(wheel_path), report)
        if also is not None and report.record is not None and report.expected_base is not None:
            ok, bad = also(Path(wheel_path), report.record, report.expected_base)
            report.ok += ok
            report.bad += bad
    except (KeyError, TypeError, AttributeError) as exc:
        report.check(False, "provenance", f"malformed record (missing or bad {exc})")
    if report.passed:
        _audit(config, Path(wheel_path), report, tree)
    return report


def _audit(config: Workspace, wheel_path: Path, report: Report, tree: Path | None) -> None:
    """The delta audit against upstream's wheel (`vllm-fork audit`), as one line."""
    try:
        audit = audit_wheel(config, wheel_path, tree=tree, checked=True)
    except NoBaselineError as exc:
        # A pure-Python build of a base without an upstream wheel has no baseline;
        # a wheel that reuses or replaces upstream's binaries always has one.
        empty = (report.record or {}).get("build", {}).get("mode") == "empty"
        report.check(empty, "delta against upstream's wheel: not audited", str(exc))
        return
    except ForkError as exc:
        report.check(False, "delta against upstream's wheel", f"cannot audit: {exc}")
        return
    unexplained = audit.unexplained
    delta = (
        f"delta against {audit.upstream_wheel}: {len(audit.members)} of {audit.compared} "
        "members differ"
    )
    report.check(
        not unexplained,
        f"{delta}, each explained by a patch or fork metadata" if not unexplained else delta,
        "unexplained: "
        + "; ".join(f"{m.path} ({m.state}: {m.detail})" for m in unexplained[:10])
        + (f" (+{len(unexplained) - 10} more)" if len(unexplained) > 10 else ""),
    )


def _rocm_pin(config: Workspace, base: Any, record: Any, report: Report) -> Any:
    """The ROCm pin a precompiled ROCm build reused (None for other builds; False, with
    the mismatch reported, when bases.toml does not pin it)."""
    if not (record.mode == "precompiled" and record.device == "rocm"):
        return None
    variant = record.rocm.variant if record.rocm else rocm_variant(record.version)
    try:
        return base.rocm_pin(variant)
    except ForkError as exc:
        report.check(False, "ROCm wheel pin", str(exc))
        return False


def _aiter(config: Workspace, version: str) -> str | None:
    return base_aiter(config, version)


def _verify(config: Workspace, wheel_path: Path, report: Report) -> None:
    with Wheel(wheel_path) as wheel:
        problems = wheel.check()
        if problems:
            report.bad += format_findings(problems)  # one line per finding, each names its member
        else:
            report.ok.append("RECORD hashes of all files")
        if not wheel.has(PACKAGE_PATH):
            report.check(False, "provenance", f"{PACKAGE_PATH} is missing: not a fork build")
            return
        try:
            record = parse(wheel.read(PACKAGE_PATH))
        except MalformedRecord as exc:
            report.check(False, "provenance", f"malformed record {PACKAGE_PATH} ({exc})")
            return
        except (ValueError, WheelError) as exc:
            report.check(False, "provenance", f"{PACKAGE_PATH} unreadable: {exc}")
            return
        report.ok.append(f"provenance {PACKAGE_PATH} (schema {record.schema})")
        version = record.version
        name_version = str(wheel.name.version)
        try:
            meta_version = wheel.metadata_version
        except WheelError as exc:
            meta_version = None
            report.check(False, "METADATA", str(exc))
        py_version = None
        if wheel.has("vllm/_version.py"):
            try:
                text = wheel.read("vllm/_version.py", limit=1 << 20).decode(errors="replace")
                m = _VERSION_PY.search(text)
                py_version = m.group(1) if m else None
            except WheelError as exc:
                report.check(False, "vllm/_version.py", str(exc))
        report.check(
            name_version == meta_version == py_version == version,
            f"version {version} in file name, METADATA, vllm/_version.py and provenance",
            f"file name {name_version}, METADATA {meta_version}, "
            f"vllm/_version.py {py_version}, provenance {version}",
        )

    try:
        base = config.base(record.base_version)
    except ForkError as exc:
        report.check(False, "base pin", str(exc))
        return
    series = config.series(base.version)
    revision = series_revision(series.directory, len(series.patches))
    mode = record.mode
    left_out = tuple(h.file for h in left_out_of(series, mode))
    rocm = _rocm_pin(config, base, record, report)
    if rocm is False:
        return
    expected = make_record(
        base=base,
        series=series,
        version=fork_version(
            base.version, revision, left_out=bool(left_out), rocm=rocm.variant if rocm else None
        ),
        revision=revision,
        mode=mode,
        device=record.device,
        tool_version=record.tool_version,
        left_out=left_out,
        rocm=rocm,
        aiter=_aiter(config, base.version) if rocm else None,
    )
    # the release-file checks (vllm_fork.deploy) read the records' JSON objects
    report.record, report.expected_base = record.to_json(), expected.to_json()["base"]
    report.check(
        record.sdist == expected.sdist,
        f"sdist {base.sdist.filename} sha256 matches bases.toml",
        f"wheel records {record.sdist.to_json()}",
    )
    if record.mode == "precompiled":
        recorded = record.upstream_wheel
        pinned = expected.upstream_wheel
        report.check(
            recorded == pinned,
            f"upstream wheel {pinned.filename if pinned else '-'} sha256 matches bases.toml",
            f"wheel records {recorded.to_json() if recorded else None}",
        )
    if rocm:
        report.check(
            record.rocm == expected.rocm,
            f"ROCm variant {rocm.variant} (ROCm {rocm.rocm}, {rocm.python}) and AITER "
            f"{expected.rocm.aiter if expected.rocm else None} match bases.toml and the base",
            f"wheel records {record.rocm.to_json() if record.rocm else None}",
        )
    recorded_out = left_out_files(record)
    report.check(
        leaves_out(version) == bool(recorded_out),
        f"version label {'says' if recorded_out else 'does not say'} .{NOFULL}, as the "
        f"provenance's left-out list ({', '.join(recorded_out) or 'none'}) requires",
        f"wheel is {version}, but its provenance left out {', '.join(recorded_out) or 'nothing'}",
    )
    report.check(
        version == expected.version,
        f"version label matches series revision {revision}"
        + (f" less the full-build-only patch(es) of a {mode} build" if left_out else ""),
        f"wheel is {version}, the current series gives {expected.version}",
    )
    report.check(
        record.left_out == expected.left_out,
        "left-out patches: "
        + (
            ", ".join(f"{p.file} ({p.change}, not in this build)" for p in expected.left_out)
            or "none"
        )
        + f" (what a {mode} build of the series leaves out)",
        f"wheel records {recorded_out or 'none'}, a {mode} build of the series leaves out "
        f"{list(left_out) or 'none'}",
    )
    _compare_patches(report, record.patches, expected.patches)
