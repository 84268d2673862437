"""Upstream credit in patch headers: the DEP-3 ``Origin`` and ``Author`` trailers.

A patch that backports an upstream PR (``Fork-Part: change`` of a change the
registry gives a PR) names the PR, its merge commit and its authors:

    Origin: backport, https://github.com/vllm-project/vllm/pull/42409, commit:be7a03ea65
    Author: Aakif Nawaz <aakif.nawaz@amd.com>

exactly as the change registry records them (``pr``, ``upstream_commit``,
``upstream_authors``). A ``Fork-Part: fix`` patch backports a later upstream
fix of the change's code: it names that fix's PR the same way
(``Origin: backport, <PR url>[, commit:<sha>]``) and credits at least one
author of it. Every other patch is the fork's own work and says
``Origin: vendor`` without ``Author`` lines. The git ``From:`` of every patch
is the fork's maintainers (docs/series-format.md). The registry is the one
source of these facts: this module checks headers against it and can write
them into the header of the patch files, never touching a diff.

    python -m vllm_fork.series.credits [--root DIR] [--write] [VERSION...]

checks (or, with ``--write``, rewrites) every series under ``DIR/series``, or
the named ones; it prints one line per problem and exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from vllm_fork import log as messages
from vllm_fork.atomic import write_bytes_atomic
from vllm_fork.config import find_root
from vllm_fork.errors import ExitCode, ForkError, SeriesError
from vllm_fork.facts import registry
from vllm_fork.facts.names import FORK_EMAIL, FORK_NAME
from vllm_fork.series import store
from vllm_fork.series.patches import (
    ORIGIN_BACKPORT,
    ORIGIN_VENDOR,
    PatchHeader,
    Series,
    load_series,
    origin_fields,
    parse_patch,
)

log = logging.getLogger(__name__)

PART_CHANGE = "change"
PART_FIX = "fix"
FORK_FROM = f"{FORK_NAME} <{FORK_EMAIL}>"
# the From: header as git format-patch folds it
FORK_FROM_LINES = [f"From: {FORK_NAME}\n", f" <{FORK_EMAIL}>\n"]


def fix_credit_problems(header: PatchHeader) -> list[str]:
    """What a ``fix`` patch's credit lacks: the upstream fix it backports
    (a backport origin with its PR url) and at least one of its authors."""
    category, url, _ = origin_fields(header.origin)
    problems: list[str] = []
    if category != ORIGIN_BACKPORT or not url:
        problems.append(
            f"{header.file}: a fix must say 'Origin: backport, <PR url>[, commit:<sha>]', "
            f"got {header.origin!r}"
        )
    if not header.authors:
        problems.append(f"{header.file}: a fix must credit the upstream fix's authors (Author)")
    return problems


def expected_credit(header: PatchHeader) -> tuple[str, tuple[str, ...]] | None:
    """The ``Origin`` value and ``Author`` values the registry asks of this
    patch, or None for a patch of a support id (test infrastructure) or a
    ``fix`` (it credits its own upstream fix, see ``fix_credit_problems``)."""
    change = registry.find(header.change)
    if change is None or header.part == PART_FIX:
        return None
    origin = change.backport_origin if header.part == PART_CHANGE else None
    if origin is None:
        return ORIGIN_VENDOR, ()
    return origin, change.upstream_authors


def credit_problems(header: PatchHeader) -> list[str]:
    """What is wrong with the patch's ``Origin``/``Author`` lines (empty: nothing)."""
    problems: list[str] = []
    if header.author != FORK_FROM:
        problems.append(f"{header.file}: From must be {FORK_FROM!r}, got {header.author!r}")
    if header.part == PART_FIX:
        return problems + fix_credit_problems(header)
    expected = expected_credit(header)
    if expected is None:
        return problems
    origin, authors = expected
    if header.values("Origin") != [origin]:
        problems.append(
            f"{header.file}: Origin must be {origin!r} (registry, {header.change}), "
            f"got {header.values('Origin')!r}"
        )
    if origin != ORIGIN_VENDOR and not authors:
        problems.append(f"{header.file}: the registry names no upstream author of {origin!r}")
    if tuple(header.authors) != authors:
        want = ", ".join(authors) if authors else "none (the fork's own work)"
        problems.append(
            f"{header.file}: Author lines must be {want} (registry, {header.change}), "
            f"got {header.authors!r}"
        )
    return problems


def check_series(series: Series) -> list[str]:
    """The credit problems of every patch of ``series``, in series order."""
    return [problem for header in series.headers for problem in credit_problems(header)]


def _message_end(lines: list[str], start: int) -> int:
    """Index of the line ending the commit message: ``---`` or the first diff."""
    for i in range(start, len(lines)):
        if lines[i] in ("---\n", "---") or lines[i].startswith("diff --git "):
            return i
    raise SeriesError("no '---' line after the commit message")


def _headers_end(lines: list[str]) -> int:
    """Index of the empty line that ends the mail headers."""
    return lines.index("\n")


def _with_fork_from(lines: list[str]) -> list[str]:
    """``lines`` with the (possibly folded) ``From:`` header set to the fork's."""
    end = _headers_end(lines)
    start = next(i for i in range(end) if lines[i].startswith("From: "))
    stop = start + 1
    while stop < end and lines[stop].startswith((" ", "\t")):
        stop += 1
    return [*lines[:start], *FORK_FROM_LINES, *lines[stop:]]


def _with_credit(lines: list[str], name: str, origin: str, authors: tuple[str, ...]) -> list[str]:
    """``lines`` with the trailer block's ``Origin``/``Author`` lines replaced by
    ``origin`` and ``authors``, where the ``Origin`` line was."""
    body = _headers_end(lines) + 1
    end = _message_end(lines, body)
    blank = max((i for i in range(body, end) if lines[i] == "\n"), default=-1)
    if blank < 0:
        raise SeriesError(f"{name}: no trailer block in the commit message")
    block = lines[blank + 1 : end]

    def credit_line(line: str) -> bool:
        return line.lower().startswith(("origin:", "author:"))

    position = next((i for i, line in enumerate(block) if line.lower().startswith("origin:")), None)
    if position is None:
        raise SeriesError(f"{name}: no Origin line in the trailer block")
    before = [line for line in block[:position] if not credit_line(line)]
    after = [line for line in block[position:] if not credit_line(line)]
    credit = [f"Origin: {origin}\n", *(f"Author: {author}\n" for author in authors)]
    return [*lines[: blank + 1], *before, *credit, *after, *lines[end:]]


def rewrite_credit(path: Path) -> bool:
    """Set the ``From:`` header to the fork's and put the registry's ``Origin``
    and ``Author`` lines into the trailer block in place of the ones there;
    nothing else in the file changes (never a diff). Returns whether the file
    changed."""
    header = parse_patch(path)
    lines = path.read_bytes().decode("utf-8").splitlines(keepends=True)
    new = lines if header.author == FORK_FROM else _with_fork_from(lines)
    expected = expected_credit(header)
    if expected is not None:
        new = _with_credit(new, path.name, *expected)
    if new == lines:
        return False
    write_bytes_atomic(path, "".join(new).encode("utf-8"))  # old or new, never half
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_fork.series.credits",
        description="check (or write) the upstream credit lines of every patch header "
        "against the change registry",
    )
    parser.add_argument("versions", nargs="*", help="series to check (default: all)")
    parser.add_argument("--root", type=Path, help="repository root (default: found from here)")
    parser.add_argument("--write", action="store_true", help="rewrite the header lines")
    args = parser.parse_args(argv)
    messages.setup()
    problems: list[str] = []
    try:
        series_root = (args.root if args.root is not None else find_root()) / "series"
        if not series_root.is_dir():
            raise SeriesError(f"no series directory {series_root}")
        versions = args.versions or store.versions(series_root)
        for version in versions:
            base = store.read_base(series_root, version)
            if base is None:
                raise SeriesError(f"no series for {version} in {series_root}")
            series = load_series(series_root / version)
            if args.write:
                with tempfile.TemporaryDirectory(prefix="vllm-fork-credits-") as tmp:
                    changed = False
                    for i, name in enumerate(base.names):
                        copy = Path(tmp) / name
                        copy.write_bytes(base.contents[i])
                        if rewrite_credit(copy):
                            log.info("rewrote the credit of %s/%s", version, name)
                            base.contents[i] = copy.read_bytes()
                            changed = True
                    if changed:
                        store.update_base(series_root, version, base)
                series = load_series(series_root / version)
            problems += [f"{version}/{problem}" for problem in check_series(series)]
    except (ForkError, OSError, ValueError) as exc:
        log.error("error: %s", exc)
        return ExitCode.USAGE
    for problem in problems:
        print(problem)
    return ExitCode.FAILED if problems else ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
