"""What a vLLM tree pins and imports of the ROCm stack, read from its sources.

- the AITER tag its ROCm base image builds (``ARG AITER_BRANCH`` in
  ``docker/Dockerfile.rocm_base``), parsed with ``dockerfile-parse``;
- every ``amdsmi`` name its Python code imports (``from amdsmi import X`` or
  ``amdsmi.X`` after ``import amdsmi``), read with ``ast``.

The ROCm simulation's contracts are keyed by these facts; nothing here is
typed by hand per release.
"""

from __future__ import annotations

import ast
import logging
from typing import Protocol

from vllm_fork.aiterpin import ROCM_BASE_DOCKERFILE, aiter_pin, dockerfile_args
from vllm_fork.facts.names import tag_for
from vllm_fork.probes.pyast import parse
from vllm_fork.sources.upstream import ensure_upstream
from vllm_fork.sources.workspace import Workspace
from vllm_fork.sourcetree import GitTree, SourceTree

log = logging.getLogger(__name__)

__all__ = ["ROCM_BASE_DOCKERFILE", "aiter_pin", "amdsmi_imports", "base_aiter", "dockerfile_args"]


class ListableTree(SourceTree, Protocol):
    def list_files(self, prefix: str) -> list[str]: ...

    def files_containing(self, prefix: str, text: str) -> list[str]: ...


def amdsmi_imports_in(source: str) -> set[str]:
    """Names of ``amdsmi`` one Python source imports or reads as attributes."""
    module = parse(source)
    if module is None:
        return set()
    names: set[str] = set()
    aliases: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and node.module == "amdsmi" and node.level == 0:
            names.update(a.name for a in node.names if a.name != "*")
        elif isinstance(node, ast.Import):
            aliases.update(a.asname or a.name for a in node.names if a.name == "amdsmi")
    if aliases:
        for node in ast.walk(module):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                names.add(node.attr)
    return names


def amdsmi_imports(tree: ListableTree, package: str = "vllm") -> dict[str, list[str]]:
    """Every ``amdsmi`` name the tree's package uses -> the files that use it."""
    users: dict[str, list[str]] = {}
    for path in tree.files_containing(package, "amdsmi"):
        if not path.endswith(".py"):
            continue
        text = tree.read_text(path)
        if text is None:
            continue
        for name in sorted(amdsmi_imports_in(text)):
            users.setdefault(name, []).append(path)
    return dict(sorted(users.items()))


def base_aiter(config: Workspace, version: str) -> str | None:
    """The AITER tag the ROCm base image of upstream's ``version`` pins (read from the
    imported sdist, ``docker/Dockerfile.rocm_base``); None when it pins none."""
    if isinstance(config, Workspace):
        ensure_upstream(config, config.base(version))
    try:
        return aiter_pin(GitTree(config.upstream_repo, tag_for(version)))
    except ValueError:
        return None
