"""How `smoke` judges the probes of an installed wheel against its provenance."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vllm_fork.probes import Finding
from vllm_fork.wheel.smoke import SmokeFailed, check_changes, smoke

from .conftest import ForkRepo
from .wheelutil import write_wheel


def entry(file: str, change: str, paths: list[str]) -> dict:
    return {"file": file, "change": change, "part": "change", "paths": paths}


RECORD = {
    "series": {
        "patches": [
            entry("0001-gate.patch", "ar-rms-pack-gate", ["vllm/_aiter_ops.py"]),
            entry("0002-gate-tests.patch", "ar-rms-pack-gate", ["tests/rocm/test_gate.py"]),
            entry(
                "0003-kernel.patch",
                "rope-cache-dtype",
                ["csrc/pos_encoding_kernels.cu", "tests/kernels/test_pos.py"],
            ),
        ]
    }
}


def test_carried_python_change_must_be_present() -> None:
    findings = {
        "ar-rms-pack-gate": Finding("present", "gate by pack"),
        "rope-cache-dtype": Finding("n/a", "csrc/pos_encoding_kernels.cu missing"),
        "moe-bias-precast": Finding("present", "cast once"),
        "dsv32-decode": Finding("absent", "no metadata cache"),
    }
    lines, failures = check_changes(RECORD, findings, None)
    assert failures == []
    assert (
        lines[0] == "ar-rms-pack-gate: present in the installed files (carried: "
        "0001-gate.patch, 0002-gate-tests.patch)"
    )
    assert lines[1].startswith("rope-cache-dtype: compiled sources only, not visible in a wheel")
    assert lines[2] == "moe-bias-precast: present in the installed files (upstream in the base)"
    assert lines[3].startswith("dsv32-decode: not carried by the series; installed files: absent")


def test_carried_change_missing_from_installed_files_fails() -> None:
    findings = {"ar-rms-pack-gate": Finding("absent", "whitelist gate")}
    lines, failures = check_changes(RECORD, findings, None)
    assert failures == [
        "ar-rms-pack-gate: carried by 0001-gate.patch, 0002-gate-tests.patch "
        "but probes absent: whitelist gate"
    ]
    assert "MISSING" in lines[0]


def test_base_findings_explain_csrc_changes_not_carried() -> None:
    record = {"series": {"patches": []}}
    findings = {"rope-cache-dtype": Finding("n/a", "csrc/pos_encoding_kernels.cu missing")}
    base = {"rope-cache-dtype": Finding("present", "kernel templated on the cache type")}
    lines, _ = check_changes(record, findings, base)
    assert lines == [
        "rope-cache-dtype: not carried by the series; installed files: n/a: "
        "csrc/pos_encoding_kernels.cu missing; base sources: present "
        "(kernel templated on the cache type)"
    ]


def test_a_change_partly_left_out_is_reported_as_such() -> None:
    """A precompiled 0.20.x wheel: the kernel backport is left out (Fork-Build:
    full), its Python check is in the wheel."""
    record = {
        "series": {
            "patches": [
                {
                    "file": "0002-check.patch",
                    "change": "rope-cache-dtype",
                    "part": "hardening",
                    "paths": ["vllm/_custom_ops.py"],
                }
            ],
            "left_out": [{"file": "0001-kernel.patch", "change": "rope-cache-dtype"}],
        }
    }
    findings = {"rope-cache-dtype": Finding("n/a", "no rotary_embedding host function")}
    base = {"rope-cache-dtype": Finding("absent", "copies the cache to float32")}
    lines, failures = check_changes(record, findings, base)
    assert failures == []
    assert lines[0] == (
        "rope-cache-dtype: left out of this build (Fork-Build: full): 0001-kernel.patch"
    )
    assert lines[1].startswith("rope-cache-dtype: not carried by the series")
    assert "base sources: absent (copies the cache to float32)" in lines[1]


def test_tests_and_hardening_patches_do_not_make_a_change_carried() -> None:
    """An upstream change pinned by fork tests and hardened by the fork (as
    rope-cache-dtype and moe-bias-precast on 0.21.0)."""
    record = {
        "series": {
            "patches": [
                {
                    "file": "0005-pin.patch",
                    "change": "rope-cache-dtype",
                    "part": "tests",
                    "paths": ["tests/kernels/core/test_rope.py"],
                },
                {
                    "file": "0006-check.patch",
                    "change": "rope-cache-dtype",
                    "part": "hardening",
                    "paths": ["vllm/_custom_ops.py"],
                },
                {
                    "file": "0004-pin.patch",
                    "change": "moe-bias-precast",
                    "part": "tests",
                    "paths": ["tests/rocm/aiter/test_moe.py"],
                },
            ]
        }
    }
    findings = {
        "rope-cache-dtype": Finding("n/a", "no rotary_embedding host function"),
        "moe-bias-precast": Finding("present", "cast once"),
    }
    base = {"rope-cache-dtype": Finding("present", "kernel templated on the cache type")}
    lines, failures = check_changes(record, findings, base)
    assert failures == []
    assert lines == [
        "rope-cache-dtype: upstream in the base sources, not visible in a wheel "
        "(kernel templated on the cache type); fork patches: 0005-pin.patch, 0006-check.patch",
        "moe-bias-precast: present in the installed files (upstream in the base; "
        "fork patches: 0004-pin.patch)",
    ]


def test_smoke_refuses_wheel_without_record(fork_repo: ForkRepo, tmp_path: Path) -> None:
    tag = "py3-none-any"
    wheel = write_wheel(tmp_path / f"vllm-1.0-{tag}.whl", {"vllm/__init__.py": b""}, "1.0", tag)
    with pytest.raises(SmokeFailed, match="not a fork build"):
        smoke(fork_repo.config, wheel)


def test_smoke_installed_needs_no_wheel_and_reports_no_install(
    fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`smoke --installed VENV --no-import` checks an existing venv without
    WHEEL; it never claims an install it did not make."""
    from vllm_fork.cli.main import main
    from vllm_fork.wheel.smoke import SmokeResult, format_result

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    # no WHEEL: accepted; this venv has no vLLM, which is what fails
    assert main(["smoke", "--installed", str(venv), "--no-import"]) == 1
    assert "vllm" in capsys.readouterr().err
    assert main(["smoke"]) == 2
    assert "give the WHEEL to install, or --installed VENV" in capsys.readouterr().err
    result = SmokeResult(0.0, 0.1, {"python": "3.12"}, imported=False, existing=venv)
    text = format_result(None, result)
    assert f"install: none (checked the existing venv {venv})" in text
    assert "install (" not in text
