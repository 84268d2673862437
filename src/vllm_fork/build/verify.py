"""`vllm-fork verify WHEEL`: does a wheel hold exactly what the series and pins say?

Checks, each reported as one line:
- every member matches its RECORD hash and size, and RECORD lists every member;
- the provenance record is present and well formed;
- the version in the file name, METADATA, ``vllm/_version.py`` and the record agree,
  and is ``<base>+hardened.<revision of the current series>``;
- the base is pinned, with the recorded sdist (and upstream wheel) sha256;
- the recorded patches are the current series: same files, order, headers and sha256.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork.build.wheelfile import Wheel
from vllm_fork.config import Config
from vllm_fork.errors import ForkError
from vllm_fork.provenance import PACKAGE_PATH, loads, make_record
from vllm_fork.series.forkversion import fork_version, series_revision
from vllm_fork.series.patches import load_series
from vllm_fork.sources.pins import load_pins

_VERSION_PY = re.compile(r"^__version__ = version = ['\"]([^'\"]+)['\"]", re.MULTILINE)


@dataclass
class Report:
    ok: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)

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


def _compare_patches(report: Report, recorded: list[dict[str, Any]], expected: list[dict]) -> None:
    rec_files = [p.get("file") for p in recorded]
    exp_files = [p["file"] for p in expected]
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
            for k in ("change", "part", "origin", "upstream_pr", "sha256", "paths")
            if rec.get(k) != exp[k]
        ]
        report.check(
            not diffs,
            f"patch {exp['file']}",
            "differs from the series in " + ", ".join(diffs),
        )
    if not expected:
        report.ok.append("series patches: none (pristine base)")


def verify_wheel(config: Config, wheel_path: Path) -> Report:
    report = Report()
    try:
        _verify(config, Path(wheel_path), report)
    except (KeyError, TypeError, AttributeError) as exc:
        report.check(False, "provenance", f"malformed record (missing or bad {exc})")
    return report


def _verify(config: Config, wheel_path: Path, report: Report) -> None:
    with Wheel(wheel_path) as wheel:
        problems = wheel.check_record()
        report.check(
            not problems,
            "RECORD hashes of all files",
            "; ".join(problems[:10])
            + (f" (+{len(problems) - 10} more)" if len(problems) > 10 else ""),
        )
        if not wheel.has(PACKAGE_PATH):
            report.check(False, "provenance", f"{PACKAGE_PATH} is missing: not a fork build")
            return
        try:
            record = loads(wheel.read(PACKAGE_PATH))
        except ValueError as exc:
            report.check(False, "provenance", f"unreadable: {exc}")
            return
        report.ok.append(f"provenance {PACKAGE_PATH} (schema {record['schema']})")
        version = record.get("version", "")
        name_version = str(wheel.name.version)
        meta_version = wheel.metadata_version
        m = (
            _VERSION_PY.search(wheel.read("vllm/_version.py").decode())
            if wheel.has("vllm/_version.py")
            else None
        )
        py_version = m.group(1) if m else None
        report.check(
            name_version == meta_version == py_version == version,
            f"version {version} in file name, METADATA, vllm/_version.py and provenance",
            f"file name {name_version}, METADATA {meta_version}, "
            f"vllm/_version.py {py_version}, provenance {version}",
        )

    try:
        base = load_pins(config.bases_file).get(record["base"]["version"])
    except (ForkError, KeyError) as exc:
        report.check(False, "base pin", str(exc))
        return
    series = load_series(config.series_dir(base.version))
    revision = series_revision(series.directory, len(series.patches))
    expected = make_record(
        base=base,
        series=series,
        version=fork_version(base.version, revision),
        revision=revision,
        mode=record.get("build", {}).get("mode", ""),
        device=record.get("build", {}).get("device", ""),
        tool_version=record.get("tool", {}).get("version", ""),
    )
    report.check(
        record["base"].get("sdist") == expected["base"]["sdist"],
        f"sdist {base.sdist.filename} sha256 matches bases.toml",
        f"wheel records {record['base'].get('sdist')}",
    )
    if record["build"]["mode"] == "precompiled":
        report.check(
            record["base"].get("upstream_wheel") == expected["base"]["upstream_wheel"],
            f"upstream wheel {base.wheel.filename if base.wheel else '-'} sha256 matches "
            "bases.toml",
            f"wheel records {record['base'].get('upstream_wheel')}",
        )
    report.check(
        version == expected["version"],
        f"version label matches series revision {revision}",
        f"wheel is {version}, the current series gives {expected['version']}",
    )
    _compare_patches(report, record["series"].get("patches", []), expected["series"]["patches"])
