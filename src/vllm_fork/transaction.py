"""The one resume-and-commit helper of the tool's long operations.

StGit's transaction is the model: the work is done off to the side (a staged
copy, a state file), and the user's files are written at the end, in one
step that a kill cannot leave half done. Two pieces, used by ``backport``,
``release-check``, ``rebase`` and the series store:

- :class:`StateFile`: a run's resumable state, one JSON document saved whole
  (atomic.py) after every change. A document of another format (``schema``,
  and the tool version where the state depends on it) or one that cannot be
  read is started afresh, with a log line; ``strict`` refuses it instead (a
  state that guards the user's work, such as a rebase in progress).
- :class:`TreeCommit`: a staged copy of a directory written into place. The
  list of files to write and to remove is recorded in the run's state before
  the first write; a run killed while writing finishes that list when it runs
  again. Without a state the order alone keeps the directory readable: new
  files first, the files named ``last`` after them, removals at the end.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vllm_fork import faults
from vllm_fork.atomic import copy_atomic, fsync_dir, write_json_atomic
from vllm_fork.errors import ForkError

log = logging.getLogger(__name__)


class StateUnreadable(ForkError):
    """A strict state file that cannot be read."""


class StateFile:
    """The resumable state of one run at ``path`` (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        schema: int,
        *,
        tool: str | None = None,
        what: str = "state",
        strict: bool = False,
        indent: int = 2,
    ) -> None:
        self.path = path
        self.schema = schema
        self.tool = tool
        self.what = what
        self.strict = strict
        self.indent = indent

    def _stamp(self) -> dict[str, Any]:
        return {"schema": self.schema, **({"tool": self.tool} if self.tool else {})}

    def load(self) -> dict[str, Any] | None:
        """The saved document, or None: there is none, or (not ``strict``) it is of
        another format or unreadable."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            if self.strict:
                raise StateUnreadable(f"{self.path} is unreadable ({exc})") from None
            log.warning("ignoring the unreadable %s %s", self.what, self.path)
            return None
        if any(data.get(k) != v for k, v in self._stamp().items()):
            if self.strict:
                raise StateUnreadable(
                    f"{self.path} was written by another version of the tool "
                    f"(schema {data.get('schema')!r}, expected {self.schema})"
                )
            log.info("starting afresh: %s %s is of another format", self.what, self.path)
            return None
        return data

    def save(self, data: dict[str, Any]) -> None:
        """Replace the document (whole or not at all), stamped with its format."""
        write_json_atomic(self.path, {**data, **self._stamp()}, indent=self.indent)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)


def plan_writes(
    root: Path, staged: Path, *, last: Iterable[str] = (), remove: bool = True
) -> tuple[list[str], list[str]]:
    """What writing the directory ``staged`` over ``root`` takes: the relative
    paths whose content is new or differs (those in ``last`` at the end, in that
    order) and, with ``remove``, the files of ``root`` that ``staged`` lacks."""
    order = {rel: n for n, rel in enumerate(last, 1)}
    write = []
    for path in sorted(staged.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(staged)
        target = root / rel
        if not target.is_file() or target.read_bytes() != path.read_bytes():
            write.append(str(rel))
    write.sort(key=lambda rel: order.get(rel, 0))
    gone = []
    if remove and root.is_dir():
        gone = [
            str(p.relative_to(root))
            for p in sorted(root.rglob("*"))
            if p.is_file() and not (staged / p.relative_to(root)).is_file()
        ]
    return write, gone


class TreeCommit:
    """Writing a staged directory into place (see the module docstring).

    ``state`` is the run's state document (a dict the caller saves with
    ``save``); the commit keeps its list under ``state[key]``. With no state the
    commit is not journaled (its order alone keeps ``root`` readable)."""

    def __init__(
        self,
        state: dict[str, Any] | None = None,
        save: Callable[[], None] | None = None,
        *,
        key: str = "commit",
        fault: str | None = None,
    ) -> None:
        self.state = state
        self.save = save or (lambda: None)
        self.key = key
        self.fault = fault

    @property
    def journal(self) -> dict[str, Any] | None:
        return None if self.state is None else self.state.get(self.key)

    @property
    def interrupted(self) -> bool:
        """A commit was recorded and not finished (a run killed while writing)."""
        journal = self.journal
        return journal is not None and not journal.get("done")

    @property
    def done(self) -> bool:
        journal = self.journal
        return journal is not None and bool(journal.get("done"))

    def run(
        self,
        root: Path,
        staged: Path,
        write: list[str],
        remove: list[str],
        *,
        apply: Callable[[], None] | None = None,
    ) -> list[str]:
        """Record ``write``/``remove`` (unless a recorded commit is being finished),
        then copy each file of ``write`` from ``staged`` into ``root`` atomically
        and remove those of ``remove`` (or call ``apply``, the caller's own writer of
        the same result, which must be idempotent); the paths touched."""
        if self.state is not None:
            if self.journal is None:
                self.state[self.key] = {"write": write, "remove": remove, "done": False}
                self.save()
            journal = self.state[self.key]
            write, remove = journal["write"], journal["remove"]
            if journal["done"]:
                return [*write, *remove]
        if apply is not None:
            apply()
            if self.fault is not None:
                faults.point(self.fault)
        else:
            for rel in write:
                copy_atomic(staged / rel, root / rel)
                if self.fault is not None:
                    faults.point(self.fault)
            for rel in remove:
                (root / rel).unlink(missing_ok=True)
        if self.state is not None:
            self.state[self.key]["done"] = True
            self.save()
        return [*write, *remove]

    def resume(
        self, root: Path, staged: Path, *, apply: Callable[[], None] | None = None
    ) -> list[str]:
        """Finish an interrupted commit."""
        assert self.interrupted
        return self.run(root, staged, [], [], apply=apply)
