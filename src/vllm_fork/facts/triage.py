"""The triage of upstream's changes: what the fork decided about each candidate.

``upstream-triage.toml`` (beside ``known-issues.toml``) is data, read by
``vllm-fork watch``. It holds:

- ``[[watch.aiter]]``: what of AITER the fork's code reaches, one table per
  entry point: ``what`` (words), ``units`` (in the ROCm/aiter repository: a
  file, a glob, or ``path.py:function``) and ``reached`` (a probe, as in the
  register, that holds on a base whose fork tree calls it). The vLLM side
  needs no configuration: the watched functions come from the series and the
  register.
- one ``[[triage]]`` per decision: the ``candidates`` it covers (the ids that
  ``watch`` prints) and either ``register = "<known-issue id>"`` (the change is
  the fix of, or the report of, a bug in the register) or ``not_relevant =
  "<one line: why>"``.

A candidate decided once is never shown again (Debian's tracker keeps a
"not-affected" with its reason for the same purpose); a rerun of ``watch``
lists only what is left.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_fork.errors import ConfigError
from vllm_fork.facts.known_issues import Probe, parse_probe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TRIAGE_FILE = "upstream-triage.toml"
REGISTER = "register"
NOT_RELEVANT = "not_relevant"
_CANDIDATE = re.compile(r"^(vllm|aiter)/\S+$")
_TOP_KEYS = {"watch", "triage"}
_WATCH_KEYS = {"aiter"}
_AITER_KEYS = {"what", "units", "reached"}
_ENTRY_KEYS = {"candidates", REGISTER, NOT_RELEVANT}


@dataclass(frozen=True)
class Decision:
    """What was decided about a candidate: a register entry, or why it does not matter."""

    kind: str  # REGISTER or NOT_RELEVANT
    text: str  # the register id, or the one-line reason

    def __str__(self) -> str:
        if self.kind == REGISTER:
            return f"register entry {self.text}"
        return f"not relevant: {self.text}"


@dataclass(frozen=True)
class AiterWatch:
    """An AITER entry point the fork's code reaches."""

    what: str
    units: tuple[str, ...]  # files, globs or ``path.py:function`` in ROCm/aiter
    reached: Probe  # holds on a vLLM tree that calls it


@dataclass(frozen=True)
class Triage:
    aiter: tuple[AiterWatch, ...] = ()
    decisions: dict[str, Decision] = field(default_factory=dict)

    def decision(self, candidate: str) -> Decision | None:
        return self.decisions.get(candidate)


def _one_line(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\n" in value.strip():
        raise ConfigError(f"{where}: expected one line of text")
    return value.strip()


def _aiter_watch(data: Any, where: str) -> AiterWatch:
    if not isinstance(data, dict) or set(data) != _AITER_KEYS:
        raise ConfigError(f"{where}: expected a table of {', '.join(sorted(_AITER_KEYS))}")
    units = data["units"]
    if not isinstance(units, list) or not units or not all(isinstance(u, str) and u for u in units):
        raise ConfigError(f"{where}.units: expected a non-empty list of paths")
    return AiterWatch(
        what=_one_line(data["what"], f"{where}.what"),
        units=tuple(units),
        reached=parse_probe(data["reached"], f"{where}.reached"),
    )


def parse_triage(text: str, source: str, issue_ids: Iterable[str] | None = None) -> Triage:
    """The triage file's text; :class:`ConfigError` names what is wrong.
    ``issue_ids``: the register's ids, which ``register`` must name."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown table(s) {', '.join(sorted(unknown))}")
    watch = data.get("watch", {})
    if not isinstance(watch, dict) or set(watch) - _WATCH_KEYS:
        raise ConfigError(f"{source}: [watch] takes only {', '.join(sorted(_WATCH_KEYS))}")
    groups = watch.get("aiter", [])
    if not isinstance(groups, list):
        raise ConfigError(f"{source}: watch.aiter must be an array of tables ([[watch.aiter]])")
    aiter = tuple(_aiter_watch(g, f"{source}: watch.aiter {i + 1}") for i, g in enumerate(groups))
    known = set(issue_ids) if issue_ids is not None else None
    entries = data.get("triage", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: 'triage' must be an array of tables ([[triage]])")
    decisions: dict[str, Decision] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: triage {i + 1}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a table")
        bad = set(entry) - _ENTRY_KEYS
        if bad:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(bad))}")
        if (REGISTER in entry) == (NOT_RELEVANT in entry):
            raise ConfigError(f"{where}: give exactly one of '{REGISTER}' or '{NOT_RELEVANT}'")
        kind = REGISTER if REGISTER in entry else NOT_RELEVANT
        decision = Decision(kind, _one_line(entry[kind], f"{where}.{kind}"))
        if kind == REGISTER and known is not None and decision.text not in known:
            raise ConfigError(
                f"{where}.register: {decision.text!r} is not an entry of known-issues.toml"
            )
        candidates = entry.get("candidates")
        if (
            not isinstance(candidates, list)
            or not candidates
            or not all(isinstance(c, str) for c in candidates)
        ):
            raise ConfigError(f"{where}.candidates: expected a non-empty list of candidate ids")
        for candidate in candidates:
            if not _CANDIDATE.match(candidate):
                raise ConfigError(
                    f"{where}.candidates: {candidate!r} is not a candidate id "
                    "(vllm/... or aiter/...)"
                )
            if candidate in decisions:
                raise ConfigError(f"{where}: candidate {candidate!r} is triaged twice")
            decisions[candidate] = decision
    return Triage(aiter, decisions)


def load_triage(path: Path, issue_ids: Iterable[str] | None = None) -> Triage:
    """The triage file at ``path`` (none: nothing triaged, no AITER paths)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Triage()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    return parse_triage(text, str(path), issue_ids)
