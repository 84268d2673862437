"""Patch series: a base's patches (read through series/store.py) and their headers.

A patch is ``git format-patch`` output. Its mail headers are read with the
stdlib ``email`` parser; the DEP-3 style fields are git trailers of the
commit message, read with ``git interpret-trailers --parse``.
"""

from __future__ import annotations

import email
import email.policy
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.errors import SeriesError, UnknownChangeError
from vllm_fork.facts import registry
from vllm_fork.facts.registry import COMMIT_PREFIX
from vllm_fork.facts.state import PARTS
from vllm_fork.git import git_env, run_git
from vllm_fork.series import store
from vllm_fork.series.forkversion import REVISION_FILE

PATCH_ID_TRAILER = "Fork-Patch"

REQUIRED = ("Fork-Change", "Fork-Part", "Origin", "Forwarded")
KNOWN_TRAILERS = (
    *REQUIRED,
    "Author",
    "Bug",
    "Applied-Upstream",
    "Fork-Proof",
    "Fork-Build",
    # the known-issue register entry (known-issues.toml) the patch fixes or mitigates
    "Fork-Fixes",
    # the patch id: one per logical patch, the same on every base that carries it
    PATCH_ID_TRAILER,
)
# ``Origin``: ``vendor`` (the fork's own work) or ``backport, <PR url>[, commit:<sha>]``;
# ``Author``: one line per upstream author of a backport (series/credits.py checks both
# against the change registry).
ORIGIN_VENDOR = "vendor"
ORIGIN_BACKPORT = "backport"
# ``Fork-Build``: which builds can carry the patch. ``full``: only a build that
# compiles the extensions (a precompiled build leaves the patch out and says so);
# ``any`` (the default when absent): every build.
BUILD_FULL = "full"
BUILD_ANY = "any"
BUILD_VALUES = (BUILD_FULL, BUILD_ANY)


def local_change_trailers(change_id: str) -> tuple[tuple[str, str], ...]:
    """The trailers of a local change's first patch (`vllm-fork change add` prints
    them): every field the header check requires, and the ``Fork-Patch`` id that
    every committed patch carries (docs/series-format.md)."""
    values = {
        "Fork-Change": change_id,
        "Fork-Part": "change",
        PATCH_ID_TRAILER: change_id,
        "Origin": ORIGIN_VENDOR,
        "Forwarded": "no",
    }
    return tuple(values.items())


def known_changes() -> tuple[str, ...]:
    return registry.header_ids()


class TrailerFields:
    """The fork's header fields of a patch file or of a work-tree commit, read
    from its git trailers (``trailers``: (key, value) pairs, in order)."""

    trailers: tuple[tuple[str, str], ...]

    def values(self, key: str) -> list[str]:
        """Every value of trailer ``key`` (case-insensitive), in order."""
        return [value for name, value in self.trailers if name.lower() == key.lower()]

    def get(self, key: str) -> str | None:
        """The first value of trailer ``key``, or None."""
        found = self.values(key)
        return found[0] if found else None

    @property
    def change(self) -> str:
        return self.get("Fork-Change") or ""

    @property
    def part(self) -> str:
        return self.get("Fork-Part") or ""

    @property
    def patch_id(self) -> str | None:
        """The ``Fork-Patch`` id: the same for one logical patch on every base
        (docs/series-format.md); None on a patch that has none."""
        return self.get(PATCH_ID_TRAILER)

    @property
    def origin(self) -> str:
        return self.get("Origin") or ""

    @property
    def origin_url(self) -> str | None:
        """The upstream PR url of a ``backport, <url>[, commit:<sha>]`` origin."""
        return origin_fields(self.origin)[1]

    @property
    def authors(self) -> list[str]:
        """The ``Author`` values (upstream authors of a backport), in order."""
        return self.values("Author")

    @property
    def forwarded(self) -> str:
        return self.get("Forwarded") or ""

    @property
    def build(self) -> str:
        """The ``Fork-Build`` value: ``full`` or ``any`` (the default)."""
        return self.get("Fork-Build") or BUILD_ANY

    @property
    def full_build_only(self) -> bool:
        return self.build == BUILD_FULL

    @property
    def bug(self) -> str | None:
        return self.get("Bug")

    @property
    def applied_upstream(self) -> str | None:
        return self.get("Applied-Upstream")


def origin_fields(origin: str) -> tuple[str, str | None, str | None]:
    """``(category, url, commit)`` of an ``Origin`` value such as
    ``backport, https://github.com/vllm-project/vllm/pull/1, commit:abc123``
    (url and commit None when absent)."""
    category, *rest = [part.strip() for part in origin.split(",")]
    url = next((p for p in rest if p and not p.startswith(COMMIT_PREFIX)), None)
    commit = next(
        (p.removeprefix(COMMIT_PREFIX) for p in rest if p.startswith(COMMIT_PREFIX)), None
    )
    return category, url, commit


@dataclass(frozen=True)
class PatchHeader(TrailerFields):
    file: str
    author: str
    date: str
    subject: str
    body: str
    trailers: tuple[tuple[str, str], ...]


def parse_trailers(message: str) -> tuple[tuple[str, str], ...]:
    """The trailers of a commit message, as git itself parses them."""
    proc = run_git(
        ["interpret-trailers", "--parse"], input=message.encode(), env=git_env(isolated=True)
    )
    trailers: list[tuple[str, str]] = []
    for line in proc.stdout.decode().splitlines():
        key, sep, value = line.partition(":")
        if sep:
            trailers.append((key.strip(), value.strip()))
    return tuple(trailers)


def split_message(payload: str) -> str:
    """The commit message part of a format-patch body (everything before ``---``)."""
    lines = payload.splitlines()
    for i, line in enumerate(lines):
        if line == "---" or line.startswith("diff --git "):
            return "\n".join(lines[:i]).strip("\n") + "\n"
    return payload


def parse_patch(path: Path) -> PatchHeader:
    """Read a patch file's header (author, date, subject, body, trailers)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SeriesError(f"cannot read patch {path}: {exc}") from exc
    if raw.startswith(b"From "):
        raw = raw.split(b"\n", 1)[1] if b"\n" in raw else b""
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    subject = str(msg.get("Subject", "")).strip()
    author = str(msg.get("From", "")).strip()
    date = str(msg.get("Date", "")).strip()
    if not subject or not author or not date:
        raise SeriesError(f"{path.name}: not a git format-patch file (From/Date/Subject missing)")
    payload = msg.get_payload(decode=True)
    text = payload.decode("utf-8", errors="replace") if isinstance(payload, bytes) else ""
    body = split_message(text)
    message = f"{subject}\n\n{body}"
    return PatchHeader(
        file=path.name,
        author=author,
        date=date,
        subject=subject,
        body=body,
        trailers=parse_trailers(message),
    )


def validate_header(header: PatchHeader, changes: tuple[str, ...] | None = None) -> None:
    """Raise :class:`SeriesError` naming the file when a field is missing or unknown."""
    missing = [key for key in REQUIRED if not header.get(key)]
    if missing:
        raise SeriesError(f"{header.file}: missing header field(s): {', '.join(missing)}")
    changes = changes if changes is not None else known_changes()
    if header.change not in changes:
        raise UnknownChangeError(
            f"{header.file}: unknown Fork-Change {header.change!r} (known: {', '.join(changes)}); "
            f"declare your own with `vllm-fork change add {header.change} --title TEXT` "
            "(local-changes.toml, docs/changes.md)"
        )
    if header.part not in PARTS:
        raise SeriesError(
            f"{header.file}: unknown Fork-Part {header.part!r} (known: {', '.join(PARTS)})"
        )
    if header.build not in BUILD_VALUES:
        raise SeriesError(
            f"{header.file}: unknown Fork-Build {header.build!r} (known: {', '.join(BUILD_VALUES)})"
        )
    origin = header.origin
    category, url, _ = origin_fields(origin)
    if not (origin == ORIGIN_VENDOR or (category == ORIGIN_BACKPORT and url)):
        raise SeriesError(
            f"{header.file}: Origin must be 'vendor' or 'backport, <PR url>[, commit:<sha>]', "
            f"got {origin!r}"
        )


@dataclass(frozen=True)
class Series:
    directory: Path  # series/<V> (its optional ``revision`` file)
    patches: tuple[Path, ...]  # private copies, named as git format-patch names them
    headers: tuple[PatchHeader, ...]
    comments: tuple[str, ...] = ()  # the series' '#' lines (Applied-Upstream history)

    def carrying(self, change: str) -> list[str]:
        return [h.file for h in self.headers if h.change == change]

    def full_build_only(self) -> tuple[PatchHeader, ...]:
        """The headers of the patches marked ``Fork-Build: full``, in series order."""
        return tuple(h for h in self.headers if h.full_build_only)

    def without(self, files: Collection[str]) -> Series:
        """This series less the patches named in ``files`` (file names)."""
        kept = [
            (p, h) for p, h in zip(self.patches, self.headers, strict=True) if h.file not in files
        ]
        return Series(
            self.directory,
            tuple(p for p, _ in kept),
            tuple(h for _, h in kept),
            self.comments,
        )

    def digest(self) -> str:
        """The series' :func:`series_digest` (of the patches it holds)."""
        return _digest(
            self.comments,
            [(p.name, p.read_bytes()) for p in self.patches],
            self.directory / REVISION_FILE,
        )


def series_digest(series_dir: Path, names: Sequence[str] | None = None) -> str:
    """The one digest of a series (read through series/store.py): sha256 over
    its comment lines, its patches in series order (``names``: only those), each
    as name, length and bytes, and its ``revision`` file. A series that cannot
    be read has the digest of what could be read (none of its patches)."""
    try:
        base = store.read_base(series_dir.parent, series_dir.name)
    except SeriesError:
        base = None
    patches = list(zip(base.names, base.contents, strict=True)) if base else []
    if names is not None:
        wanted = set(names)
        patches = [(n, d) for n, d in patches if n in wanted]
    return _digest(base.comments if base else (), patches, series_dir / REVISION_FILE)


def _digest(comments: Sequence[str], patches: Sequence[tuple[str, bytes]], revision: Path) -> str:
    rev = revision.read_bytes() if revision.is_file() else b""
    return store.content_digest(comments, (*patches, (REVISION_FILE, rev)))


def load_series(series_dir: Path, *, validate: bool = True) -> Series:
    """Read and validate a base's series (``series_dir``: series/<V>; its patches
    in series/pool/, read through series/store.py)."""
    base = store.read_base(series_dir.parent, series_dir.name)
    if base is None:
        return Series(series_dir, (), ())
    _, paths = store.expand(base)
    headers: list[PatchHeader] = []
    for path in paths:
        header = parse_patch(path)
        if validate:
            validate_header(header)
        headers.append(header)
    return Series(series_dir, tuple(paths), tuple(headers), tuple(base.comments))
