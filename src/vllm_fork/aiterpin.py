"""The AITER a vLLM tree's ROCm base image builds: ``ARG AITER_BRANCH`` in
``docker/Dockerfile.rocm_base``, parsed with ``dockerfile-parse``.

One fact per base, read by status, matrix, the README table, the upstream watch
and the register's ``aiter_below`` clauses."""

from __future__ import annotations

import io
import shlex

from dockerfile_parse import DockerfileParser
from packaging.version import InvalidVersion, Version

from vllm_fork.sourcetree import SourceTree

ROCM_BASE_DOCKERFILE = "docker/Dockerfile.rocm_base"
AITER_ARG = "AITER_BRANCH"


def dockerfile_args(text: str) -> dict[str, str]:
    """``ARG name=value`` defaults of a Dockerfile, first definition wins."""
    # A file object keeps the parser from creating ./Dockerfile.
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode("utf-8")), env_replace=False)
    found: dict[str, str] = {}
    for instr in parser.structure:
        if instr["instruction"] != "ARG":
            continue
        try:
            words = shlex.split(instr["value"], comments=True)
        except ValueError:
            continue
        for word in words:
            name, sep, value = word.partition("=")
            if sep and name not in found:
                found[name] = value
    return found


def aiter_pin(tree: SourceTree) -> str | None:
    """The AITER tag (or branch) the tree's ROCm base image checks out; None
    when the tree has no ROCm base Dockerfile or it names no AITER_BRANCH."""
    text = tree.read_text(ROCM_BASE_DOCKERFILE)
    if text is None:
        return None
    return dockerfile_args(text).get(AITER_ARG) or None


def aiter_version(tag: str) -> Version | None:
    """``v0.1.19.post1`` -> Version('0.1.19.post1'); None for a branch or commit."""
    try:
        return Version(tag.removeprefix("v"))
    except InvalidVersion:
        return None
