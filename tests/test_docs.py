"""The README's commands table is checked against the command line itself."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from vllm_fork.cli.main import COMMANDS, build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_rows() -> dict[str, str]:
    """command name -> the first cell of its row (every `vllm-fork ...` in it)."""
    rows: dict[str, str] = {}
    for line in README.read_text().splitlines():
        match = re.match(r"^\| `vllm-fork ([a-z-]+)", line)
        if match:
            rows.setdefault(match.group(1), re.split(r"(?<!\\)\| ", line)[1])
    return rows


def _options(name: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {opt for action in sub.choices[name]._actions for opt in action.option_strings}


def test_every_command_has_a_row_in_the_readme() -> None:
    rows = _readme_rows()
    assert sorted(set(COMMANDS) - set(rows)) == []
    assert sorted(set(rows) - set(COMMANDS)) == []


def test_every_option_the_readme_shows_exists() -> None:
    wrong = []
    for name, cell in _readme_rows().items():
        known = _options(name)
        for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", cell):
            if option not in known:
                wrong.append(f"{name} {option}")
    assert wrong == []


def test_fork_version_labels_in_the_docs_are_what_a_build_makes() -> None:
    """A label such as `0.21.0+hardened.22.nofull` in the docs is the one the
    build of that base makes (the series revision; .nofull where a precompiled
    build leaves patches out), not one no build makes."""
    from vllm_fork.series.forkversion import series_revision
    from vllm_fork.sources.workspace import load_config

    config = load_config(root=README.parent)
    wrong = []
    for doc in [README, *sorted((README.parent / "docs").glob("*.md"))]:
        for base, rev, nofull in re.findall(
            r"(\d+\.\d+\.\d+)\+hardened\.(\d+)((?:\.nofull)?)", doc.read_text()
        ):
            series = config.series(base)
            want = series_revision(config.series_dir(base), len(series.patches))
            full_only = any(h.build == "full" for h in series.headers)
            if int(rev) != want or (nofull and not full_only):
                wrong.append(f"{doc.name}: {base}+hardened.{rev}{nofull} (a build makes {want})")
    assert wrong == []


def test_tables_write_makes_the_version_labels_current() -> None:
    """A label left behind by a new patch on a base is what `tables --write`
    rewrites (the local-change flow runs it), in the README and every doc."""
    from vllm_fork.reports import tables
    from vllm_fork.series.forkversion import series_revision
    from vllm_fork.sources.workspace import load_config

    config = load_config(root=README.parent, offline=True)
    n = series_revision(config.series_dir("0.21.0"), len(config.series("0.21.0").patches))
    text = "build 0.21.0+hardened.1 (or 0.21.0+hardened.1.nofull); 9.9.9+hardened.4 is no base"
    assert tables.relabel(text, config) == (
        f"build 0.21.0+hardened.{n} (or 0.21.0+hardened.{n}.nofull); 9.9.9+hardened.4 is no base"
    )
    assert "docs/build.md" in tables.documents(config)
    assert "docs/deploy.md" in tables.documents(config)


def test_the_first_screen_commands_exist() -> None:
    """The first-day paths at the top of the README (the AMD one: pin the ROCm
    wheel, then `scripts/main.sh --device rocm`; the CUDA default) name scripts
    that exist and options the tool has."""
    import os

    first = README.read_text().split("### ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", first, re.S)
    lines = [ln.split("#", 1)[0].split() for b in blocks for ln in b.splitlines() if ln.strip()]
    assert ["scripts/main.sh", "--device", "rocm"] in lines and ["scripts/main.sh"] in lines
    pins = [ln for ln in lines if ln[:2] == ["scripts/vllm-fork", "pin"]]
    assert pins and "--rocm-index" in pins[0]
    root = README.parent
    for words in lines:
        script = root / words[0]
        assert script.is_file() and os.access(script, os.X_OK), words[0]
        options = {w for w in words if w.startswith("--")}
        if words[0] == "scripts/vllm-fork":
            assert options <= _options(words[1]), words
        if words[0] == "scripts/main.sh":  # extra arguments go to `vllm-fork build`
            assert options <= _options("build"), words
