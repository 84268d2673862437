"""Record in the series which patches upstream absorbed.

Two records, both written by a successful rebase:

- the new series gets one comment line per dropped patch,
  ``# Applied-Upstream: <V2> <- <patch> (<change>, <part>): <why>``
  (``# Dropped-By-Hand: ...`` for a patch dropped with ``--skip``);
- the patch in the old series (except one dropped with ``--skip``) gets
  the trailer ``Applied-Upstream: <V2>`` (``git interpret-trailers``),
  so that materialize -> export of the old base keeps it byte-stable.
  The trailer names the first release that absorbed the patch: a later
  rebase straight onto a newer release (0.21.0 -> 0.33.0 after 0.21.0 ->
  0.22.0) keeps the earlier value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from vllm_fork.errors import SeriesError
from vllm_fork.git import git_env, run_git
from vllm_fork.series import store
from vllm_fork.series.patches import parse_trailers
from vllm_fork.series.store import SERIES_FILE

TRAILER = "Applied-Upstream"
COMMENT_PREFIX = f"# {TRAILER}: "
SKIPPED_PREFIX = "# Dropped-By-Hand: "
HISTORY_HEADER = "# Patches dropped because upstream has them (kept in the older series):\n"


@dataclass(frozen=True)
class Absorbed:
    patch: str  # file name in the old series (or the commit subject when unknown)
    change: str
    part: str
    reason: str
    by_hand: bool = False  # dropped with --skip: upstream having it is not established


def _one_line(text: str) -> str:
    return " ".join(text.split())


def write_series_history(series_dir: Path, version: str, absorbed: list[Absorbed]) -> None:
    """Replace the ``# Applied-Upstream:`` comment block of ``version``'s series
    (``series_dir``: series/<V>; stored once, series/store.py)."""
    root = series_dir.parent
    block = [HISTORY_HEADER] if absorbed else []
    block += [
        f"{SKIPPED_PREFIX if a.by_hand else COMMENT_PREFIX}{version} <- {a.patch} "
        f"({a.change}, {a.part}): {_one_line(a.reason)}\n"
        for a in absorbed
    ]
    if store.is_stored(root):
        base = store.read_base(root, series_dir.name) or store.BaseSeries()
        comments = [ln.rstrip("\n") for ln in block] + [
            ln for ln in base.comments if not _is_history(ln + "\n")
        ]
        if comments != base.comments:
            base.comments = comments
            store.update_base(root, series_dir.name, base)
        return
    series_file = series_dir / SERIES_FILE
    lines = series_file.read_text().splitlines(keepends=True) if series_file.is_file() else []
    kept = [ln for ln in lines if not _is_history(ln)]
    # After the leading comment lines (the file's header), before the patch names.
    at = 0
    while at < len(kept) and kept[at].startswith("#"):
        at += 1
    new = kept[:at] + block + kept[at:]
    if new != lines:
        series_dir.mkdir(parents=True, exist_ok=True)
        series_file.write_text("".join(new))


def _is_history(line: str) -> bool:
    return line.startswith((COMMENT_PREFIX, SKIPPED_PREFIX)) or line == HISTORY_HEADER


def _trailered(message: bytes, version: str) -> bytes:
    proc = run_git(
        [
            "interpret-trailers",
            "--if-exists",
            "replace",
            "--if-missing",
            "add",
            "--trailer",
            f"{TRAILER}: {version}",
        ],
        input=b"subject\n\n" + message,
        env=git_env(isolated=True),
    )
    out = proc.stdout
    if not out.startswith(b"subject\n\n"):
        raise SeriesError("git interpret-trailers changed the subject line")
    return out[len(b"subject\n\n") :]


def _is_earlier_or_same(recorded: str, version: str) -> bool:
    try:
        return Version(recorded) <= Version(version)
    except InvalidVersion:
        return False


def with_applied_upstream(data: bytes, version: str, name: str) -> bytes:
    """A format-patch file's bytes with ``Applied-Upstream: <version>`` added (or
    lowered). An existing value naming ``version`` or an earlier release is
    kept: the trailer records the first release with the change. Only the
    commit message is touched: the mail headers and everything from the
    ``---`` line on stay as they are."""
    head, sep, rest = data.partition(b"\n\n")
    if not sep:
        raise SeriesError(f"{name}: not a git format-patch file (no header end)")
    if rest.startswith(b"---\n"):
        message, tail = b"", rest
    else:
        marker = rest.find(b"\n---\n")
        if marker < 0:
            raise SeriesError(f"{name}: no '---' line after the commit message")
        message, tail = rest[: marker + 1], rest[marker + 1 :]
    recorded = dict(parse_trailers(message.decode("utf-8", errors="replace"))).get(TRAILER)
    if recorded and _is_earlier_or_same(recorded.strip(), version):
        return data
    return head + sep + _trailered(message, version) + tail


def add_applied_upstream(patch: Path, version: str) -> bool:
    """Add ``Applied-Upstream: <version>`` to a format-patch file (see
    :func:`with_applied_upstream`); returns whether the file changed."""
    data = patch.read_bytes()
    new = with_applied_upstream(data, version, patch.name)
    if new == data:
        return False
    tmp = patch.with_name(patch.name + ".tmp")
    tmp.write_bytes(new)
    tmp.replace(patch)
    return True


def mark_applied_upstream(series_dir: Path, names: list[str], version: str) -> list[str]:
    """Add ``Applied-Upstream: <version>`` to the patches ``names`` of the series
    in ``series_dir`` (series/<V>, either layout); returns the names changed."""
    root = series_dir.parent
    if not store.is_stored(root):
        return [
            name
            for name in names
            if (series_dir / name).is_file() and add_applied_upstream(series_dir / name, version)
        ]
    base = store.read_base(root, series_dir.name)
    if base is None:
        return []
    changed: list[str] = []
    for i, name in enumerate(base.names):
        if name in names:
            new = with_applied_upstream(base.contents[i], version, name)
            if new != base.contents[i]:
                base.contents[i] = new
                changed.append(name)
    if changed:
        store.update_base(root, series_dir.name, base)
    return changed
