"""`vllm-fork smoke WHEEL`: install a fork wheel into a fresh venv and check it on CPU.

- pip installs the wheel with its dependencies (the user's pip configuration
  applies); the install time is printed;
- ``import vllm`` works and ``vllm.__version__`` and the installed
  distribution's version are the wheel's version;
- the change probes run on the installed package directory: every change
  the series carries in Python files must be present. Changes carried only
  in compiled sources (csrc/) cannot be seen in a wheel: they are reported
  from the provenance record.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork.errors import ForkError
from vllm_fork.facts.finding import UNPROBED
from vllm_fork.facts.state import PART_CHANGE, carries
from vllm_fork.probes import DirTree, base_findings, probe_all
from vllm_fork.sources.workspace import Workspace
from vllm_fork.wheel.inside import script
from vllm_fork.wheel.provenance import PACKAGE_PATH, ProvenanceError, from_wheel, loads
from vllm_fork.wheel.wheelfile import Wheel, format_findings


class SmokeFailed(ForkError):
    """The installed wheel does not work or lacks a change."""


@dataclass
class SmokeResult:
    install_seconds: float
    import_seconds: float
    info: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    imported: bool = True
    deps: bool = True  # installed with its dependencies
    existing: Path | None = None  # the venv checked as it was (--installed): no install
    installed: bool = True  # False: refused before pip saw it (failures say why)


log = logging.getLogger(__name__)


def _py_paths(paths: list[str]) -> list[str]:
    """The paths of a patch that end up as installed Python files."""
    return [p for p in paths if p.startswith("vllm/") and p.endswith(".py")]


def check_changes(
    record: dict[str, Any], findings: dict[str, Any], base_findings: dict[str, Any] | None
) -> tuple[list[str], list[str]]:
    """Report lines and failures: probes of the installed files against the record.

    A change is carried when a patch of ``Fork-Part: change`` brings it; tests and
    hardening patches of a change upstream already has do not make it carried.
    """
    lines: list[str] = []
    failures: list[str] = []
    patches = record["series"]["patches"]
    left_out = record["series"].get("left_out", [])
    for change, finding in findings.items():
        out = ", ".join(p["file"] for p in left_out if p["change"] == change)
        if out:
            lines.append(f"{change}: left out of this build (Fork-Build: full): {out}")
        related = [p for p in patches if p["change"] == change]
        carrying = [p for p in related if carries([p.get("part", PART_CHANGE)])]
        py = sorted({path for p in carrying for path in _py_paths(p.get("paths", []))})
        files = ", ".join(p["file"] for p in related)
        state = f"{finding.state}: {finding.reason}"
        base = base_findings.get(change) if base_findings else None
        if carrying and finding.state == UNPROBED:
            lines.append(f"{change}: a local change (no probe); provenance: carried by {files}")
        elif carrying and py:
            if finding.state == "present":
                lines.append(f"{change}: present in the installed files (carried: {files})")
            else:
                failures.append(f"{change}: carried by {files} but probes {state}")
                lines.append(f"{change}: MISSING from the installed files ({state})")
        elif carrying:
            lines.append(
                f"{change}: compiled sources only, not visible in a wheel; provenance: "
                f"carried by {files}"
            )
        elif finding.state == "present":
            extra = f"; fork patches: {files}" if related else ""
            lines.append(f"{change}: present in the installed files (upstream in the base{extra})")
        elif base is not None and base.state == "present" and related:
            lines.append(
                f"{change}: upstream in the base sources, not visible in a wheel "
                f"({base.reason}); fork patches: {files}"
            )
        else:
            where = f"; base sources: {base.state} ({base.reason})" if base is not None else ""
            lines.append(f"{change}: not carried by the series; installed files: {state}{where}")
    return lines, failures


def smoke(
    config: Workspace,
    wheel_path: Path | None,
    *,
    venv: Path | None = None,
    python: str = sys.executable,
    installed: Path | None = None,
    import_vllm: bool = True,
    deps: bool = True,
) -> SmokeResult:
    """Install ``wheel_path`` into a fresh venv and check it; or, given ``installed`` (a
    venv where the wheel was installed some other way, e.g. from an index), check that.
    ``import_vllm=False``: read the installed files only (an install without dependencies).
    ``deps=False``: install the wheel alone (``pip --no-deps``); vLLM is then not imported.
    ``wheel_path`` None (only with ``installed``): the installed record is the reference.
    """
    import_vllm = import_vllm and deps
    record: dict[str, Any] | None = None
    if wheel_path is None:
        if installed is None:
            raise SmokeFailed("give the WHEEL to install, or --installed VENV to check")
    else:
        wheel_path = Path(wheel_path).resolve()
        with Wheel(wheel_path) as wheel:
            # pip would extract what the wheel holds: a wheel with any finding (an unsafe
            # name, a link, a bomb, a RECORD that does not match) is refused before it
            problems = wheel.check()
            try:
                record = from_wheel(wheel)
            except ProvenanceError as exc:
                if not problems:
                    raise SmokeFailed(str(exc)) from None
                problems.append(str(exc))
        if problems:
            return SmokeResult(
                0.0,
                0.0,
                {"python": "-"},
                failures=format_findings(problems),
                imported=False,
                deps=deps,
                installed=False,
            )
    keep = venv is not None or installed is not None
    if installed is not None:
        venv = Path(installed)
    elif venv is None:
        config.cache.work.mkdir(parents=True, exist_ok=True)
        venv = Path(tempfile.mkdtemp(prefix="smoke-", dir=config.cache.work)) / "venv"
    elif venv.exists():
        raise SmokeFailed(f"{venv} exists; smoke installs into a fresh venv only")
    vpy = venv / "bin" / "python"
    try:
        install_seconds = 0.0
        if installed is None:
            assert wheel_path is not None
            subprocess.run([python, "-m", "venv", venv], check=True)
            what = "with its dependencies" if deps else "alone (--no-deps)"
            log.info(f"installing {wheel_path.name} {what} into {venv}")
            t0 = time.monotonic()
            no_deps = [] if deps else ["--no-deps"]
            proc = subprocess.run(
                [vpy, "-m", "pip", "install", "--no-input", "-q", *no_deps, wheel_path]
            )
            install_seconds = time.monotonic() - t0
            if proc.returncode != 0:
                raise SmokeFailed(
                    f"pip could not install {wheel_path.name} (exit {proc.returncode})"
                )
        elif not vpy.is_file():
            raise SmokeFailed(f"{venv} is not a venv (no bin/python)")
        t0 = time.monotonic()
        proc2 = subprocess.run(
            # inside/importcheck.py imports vLLM on CPU and reports what it sees;
            # inside/locate.py finds the same facts without importing it
            [vpy, "-I", script("importcheck" if import_vllm else "locate")],
            capture_output=True,
            text=True,
            env=_import_env(),
        )
        import_seconds = time.monotonic() - t0
        if proc2.returncode != 0:
            tail = "\n".join(proc2.stderr.strip().splitlines()[-20:])
            raise SmokeFailed(f"`import vllm` failed in the new venv:\n{tail}")
        info = json.loads(proc2.stdout.strip().splitlines()[-1])
        result = SmokeResult(
            install_seconds,
            import_seconds,
            info,
            imported=import_vllm,
            deps=deps,
            existing=Path(installed) if installed is not None else None,
        )
        installed_record = loads(info.pop("provenance"))
        if record is None:
            record = installed_record
            result.lines.append(f"no WHEEL given: the installed {PACKAGE_PATH} is the reference")
        elif installed_record == record:
            result.lines.append(f"installed {PACKAGE_PATH} is the wheel's record")
        else:
            result.failures.append(f"installed {PACKAGE_PATH} differs from the wheel's")
        expected = record["version"]
        for key, label in (("version", "vllm.__version__"), ("dist_version", "installed version")):
            if info[key] == expected:
                result.lines.append(f"{label} {info[key]}")
            else:
                result.failures.append(f"{label} is {info[key]}, the wheel is {expected}")

        site = Path(info["package_dir"]).parent
        findings = probe_all(DirTree(site))
        pristine = base_findings(config, record["base"]["version"])
        lines, failures = check_changes(record, findings, pristine)
        result.lines += lines
        result.failures += failures
        return result
    finally:
        if not keep:
            shutil.rmtree(venv.parent, ignore_errors=True)


def _import_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def format_result(wheel: Path | None, result: SmokeResult) -> str:
    if not result.installed:
        lines = [f"smoke {Path(wheel).name if wheel else '-'}"]
        lines.append("not installed: the wheel itself has findings")
        lines += [f"FAILED: {f}" for f in result.failures]
        lines.append("smoke: FAILED")
        return "\n".join(lines)
    if result.existing is not None:
        install = f"install: none (checked the existing venv {result.existing})"
    else:
        install = (
            f"install ({'with its dependencies' if result.deps else 'alone, --no-deps'}): "
            f"{result.install_seconds:.0f} s"
        )
    lines = [
        f"smoke {Path(wheel).name if wheel is not None else result.existing}",
        install,
        f"import vllm on CPU: ok in {result.import_seconds:.1f} s (Python {result.info['python']})"
        if result.imported
        else f"import vllm: not run (installed files only; Python {result.info['python']})",
        *result.lines,
    ]
    lines += [f"FAILED: {f}" for f in result.failures]
    lines.append("smoke: " + ("passed" if not result.failures else "FAILED"))
    return "\n".join(lines)
