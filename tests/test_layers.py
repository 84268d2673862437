"""The tool's layers (docs/architecture.md, pyproject's [tool.importlinter]).

``lint-imports`` keeps the contracts on the package as it is, and breaks on a
copy with one upward import planted; the rest of the package (outside the
command line) imports its own modules at module level only, so the import
graph the contracts check is the whole graph.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "vllm_fork"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# Function-level imports kept on purpose outside cli/ (the command line imports
# each subcommand's modules lazily, documented in cli/main.py): heavy libraries
# that one rarely used path needs, each with its reason at the import.
LAZY = {
    ("deploy/publish.py", "twine.settings"),
    ("deploy/publish.py", "twine.exceptions"),
    ("deploy/publish.py", "twine.package"),
    ("deploy/sbom.py", "cyclonedx.validation.json"),
}
# wheel/inside/ runs in another Python (the build or smoke environment), where
# torch may be missing: its scripts import it inside a try.
OTHER_PYTHON = "wheel/inside/"


def lint_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.is_file():
        pytest.fail(f"{LINT_IMPORTS} is missing: install the dev extras (pip install -e .[dev])")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_the_package_keeps_its_layer_contracts() -> None:
    proc = lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout
    assert "Layers: no upward import KEPT" in proc.stdout


def test_a_planted_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    copy = tmp_path / "src" / "vllm_fork"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    # the bottom layer's state rule importing the status report (a layer far above)
    state = copy / "facts" / "state.py"
    text = state.read_text()
    marker = "from __future__ import annotations\n"
    assert marker in text
    state.write_text(text.replace(marker, marker + "\nimport vllm_fork.reports.status\n", 1))
    # the copy, not the installed package, is the one analysed
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "src"))
    proc = lint_imports(tmp_path, env)
    assert proc.returncode != 0, proc.stdout
    assert "Layers: no upward import BROKEN" in proc.stdout
    assert "vllm_fork.facts.state -> vllm_fork.reports.status" in proc.stdout


def function_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) of each import inside a function or class of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` and version switches are module level
        if isinstance(node, (ast.If, ast.Try)):
            top.update(id(inner) for inner in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in top:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." * node.level + (node.module or "")))
    return found


def test_no_function_level_imports_outside_the_cli() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(("cli/", OTHER_PYTHON)):
            continue
        found += [(rel, line, mod) for line, mod in function_level_imports(path)]
    unexpected = [f"{rel}:{line}: {mod}" for rel, line, mod in found if (rel, mod) not in LAZY]
    assert not unexpected, "function-level imports:\n" + "\n".join(unexpected)
    assert {(rel, mod) for rel, _, mod in found} == LAZY  # none of them is stale


def test_the_cli_imports_lazily_only_subcommand_modules() -> None:
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for line, mod in function_level_imports(path):
            assert mod.startswith("vllm_fork."), f"cli/{path.name}:{line}: {mod}"
            assert mod != "vllm_fork.errors", f"cli/{path.name}:{line}: {mod}"


def test_the_function_level_check_sees_a_planted_import(tmp_path: Path) -> None:
    planted = tmp_path / "m.py"
    planted.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import json\n"
        "def f():\n    from vllm_fork.git import run_git\n    return run_git\n"
    )
    assert function_level_imports(planted) == [(5, "vllm_fork.git")]


def test_every_module_of_the_package_is_in_a_layer() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["type"] == "layers"]
    named = {m.strip() for layer in layers["layers"] for m in layer.split("|")}
    present = {
        f"vllm_fork.{p.stem if p.is_file() else p.name}"
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    }
    assert present == named, f"not in a layer: {present - named}; gone: {named - present}"
