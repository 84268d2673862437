"""Upstream credit in the patch headers: every backport names the registry's
PR, merge commit and authors (DEP-3 Origin / Author); the check reads the
registry and reports a patch that lacks them."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest

from vllm_fork.facts import registry
from vllm_fork.series import credits, store
from vllm_fork.series.patches import load_series, origin_fields, parse_patch, validate_header
from vllm_fork.wheel.provenance import upstream_pr

ROOT = Path(__file__).resolve().parents[1]
GATE = "0001-ROCm-AITER-Gate-the-1-stage-fused-allreduce-RMSNorm-.patch"
SWITCH = "0002-ROCm-AITER-Add-a-switch-forcing-the-2-stage-fused-al.patch"


def _series_versions() -> list[str]:
    return store.versions(ROOT / "series")


@pytest.mark.parametrize("version", _series_versions())
def test_every_committed_patch_credits_upstream_as_the_registry_says(version: str) -> None:
    assert credits.check_series(load_series(ROOT / "series" / version)) == []


def test_every_backport_of_the_committed_series_names_pr_commit_and_authors() -> None:
    seen = set()
    for version in _series_versions():
        for header in load_series(ROOT / "series" / version).headers:
            category, url, commit = origin_fields(header.origin)
            if header.part == "fix":  # credits the upstream fix it backports
                assert category == "backport" and url and header.authors, header.file
                continue
            if category == "backport":
                change = registry.get(header.change)
                assert url == change.pr_url and commit == change.upstream_commit, header.file
                assert header.authors and header.authors == list(change.upstream_authors)
                seen.add(change.id)
            else:
                assert header.origin == "vendor" and header.authors == [], header.file
    assert seen == {c.id for c in registry.changes() if c.pr is not None}


def test_registry_records_who_wrote_each_upstream_pr() -> None:
    for change in registry.changes():
        if change.pr is None:
            assert change.backport_origin is None and not change.upstream_authors, change.id
            continue
        assert change.upstream_authors, change.id
        for author in change.upstream_authors:
            assert re.fullmatch(r"[^<>\n]+ <[^<>\s]+>", author), (change.id, author)
        if change.upstream_commit is not None:
            assert re.fullmatch(r"[0-9a-f]{10}|[0-9a-f]{12}|[0-9a-f]{40}", change.upstream_commit)


def _committed(version: str, name: str) -> Path:
    """A committed patch file (the series is stored once: read through the store)."""
    (path,) = [p for p in load_series(ROOT / "series" / version).patches if p.name == name]
    return path


def _copy(tmp_path: Path, name: str = GATE, version: str = "0.21.0") -> Path:
    """A committed patch as a file of its own, to edit."""
    target = tmp_path / "patches" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_committed(version, name), target)
    return target


def _stored(tmp_path: Path, patch: Path, version: str = "0.21.0") -> Path:
    """A repository under ``tmp_path`` whose series of ``version`` is ``patch``
    alone; returns its series/."""
    root = tmp_path / "series"
    base = store.BaseSeries([store.stem_of(patch.name)], [patch.read_bytes()])
    store.write_store(root, {version: base})
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def test_a_backport_without_authors_or_commit_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    patch = _copy(tmp_path)
    _edit(patch, "Author: Aakif Nawaz <aakif.nawaz@amd.com>\n", "")
    _edit(patch, ", commit:be7a03ea65\n", "\n")
    problems = credits.credit_problems(parse_patch(patch))
    assert len(problems) == 2
    assert problems[0].startswith(f"{GATE}: Origin must be ")
    assert "pull/42409, commit:be7a03ea65" in problems[0]
    assert problems[1].startswith(f"{GATE}: Author lines must be Aakif Nawaz")

    _stored(tmp_path, patch)
    assert credits.main(["--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"0.21.0/{problem}" for problem in problems]


def test_write_puts_back_the_credit_and_touches_nothing_else(tmp_path: Path) -> None:
    patch = _copy(tmp_path)
    pristine = patch.read_bytes()
    _edit(patch, "Author: Aakif Nawaz <aakif.nawaz@amd.com>\n", "Author: Someone <x@y.z>\n")
    _edit(patch, ", commit:be7a03ea65\n", "\n")
    root = _stored(tmp_path, patch)
    assert credits.main(["--root", str(tmp_path), "--write"]) == 0
    written = store.read_base(root, "0.21.0")
    assert written is not None and written.contents == [pristine]
    assert not list((root / "pool").glob(f"*{store.pool_name('x', patch.read_bytes())[-16:]}"))
    patch.write_bytes(pristine)
    assert credits.rewrite_credit(patch) is False  # already right: the file is left alone


def test_a_vendor_patch_claiming_upstream_authors_is_reported(tmp_path: Path) -> None:
    patch = _copy(tmp_path, SWITCH)
    _edit(patch, "Origin: vendor\n", "Origin: vendor\nAuthor: Someone <x@y.z>\n")
    (problem,) = credits.credit_problems(parse_patch(patch))
    assert problem.startswith(f"{SWITCH}: Author lines must be none (the fork's own work)")
    _edit(
        patch, "Origin: vendor\n", "Origin: backport, https://github.com/vllm-project/vllm/pull/1\n"
    )
    problems = credits.credit_problems(parse_patch(patch))
    assert problems[0].startswith(f"{SWITCH}: Origin must be 'vendor'")


def test_a_fix_credits_the_upstream_fix_it_backports(tmp_path: Path) -> None:
    patch = _copy(tmp_path, SWITCH)
    _edit(patch, "Fork-Part: hardening\n", "Fork-Part: fix\n")
    problems = credits.credit_problems(parse_patch(patch))
    assert [p.split(": ")[1] for p in problems] == [
        "a fix must say 'Origin",
        "a fix must credit the upstream fix's authors (Author)",
    ]
    fix_origin = "backport, https://github.com/vllm-project/vllm/pull/47404, commit:bbb0f945ff"
    _edit(patch, "Origin: vendor\n", f"Origin: {fix_origin}\n")
    (problem,) = credits.credit_problems(parse_patch(patch))
    assert problem.endswith("(Author)")
    _edit(
        patch, f"Origin: {fix_origin}\n", f"Origin: {fix_origin}\nAuthor: ZihaoMu <zmu@amd.com>\n"
    )
    assert credits.credit_problems(parse_patch(patch)) == []
    validate_header(parse_patch(patch))
    assert credits.rewrite_credit(patch) is False  # the registry's credit is not forced on it


def test_the_check_reads_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    patch = _copy(tmp_path)
    assert credits.credit_problems(parse_patch(patch)) == []
    gate = registry.get("ar-rms-pack-gate")
    moved = dataclasses.replace(
        gate, upstream_commit="0123456789", upstream_authors=(*gate.upstream_authors, "B <b@c.d>")
    )
    monkeypatch.setattr(
        registry, "CHANGES", tuple(moved if c is gate else c for c in registry.CHANGES)
    )
    problems = credits.credit_problems(parse_patch(patch))
    assert "commit:0123456789" in problems[0]
    want = f"{GATE}: Author lines must be Aakif Nawaz <aakif.nawaz@amd.com>, B <b@c.d>"
    assert problems[1].startswith(want)
    assert credits.rewrite_credit(patch)
    text = patch.read_text()
    assert "pull/42409, commit:0123456789\nAuthor: Aakif Nawaz <aakif.nawaz@amd.com>\n" in text
    assert "Author: B <b@c.d>\nForwarded: not-needed\n" in text


def test_origin_with_a_commit_is_a_valid_header_and_names_the_pr() -> None:
    header = parse_patch(_committed("0.21.0", GATE))
    validate_header(header)
    url = "https://github.com/vllm-project/vllm/pull/42409"
    assert origin_fields(header.origin) == ("backport", url, "be7a03ea65")
    assert header.origin_url == url
    assert upstream_pr(header.change, header.origin) == url


def test_bad_input_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _stored(tmp_path / "a", _copy(tmp_path / "a"))
    broken = _copy(tmp_path / "b")
    broken.write_bytes(b"\xff\xfe not a patch\n")
    root = _stored(tmp_path / "b", broken)
    runs = {
        "no such series": (["--root", str(tmp_path / "a"), "0.99.0"], "no series for 0.99.0"),
        "no series dir": (["--root", str(tmp_path / "nowhere")], "nowhere/series"),
        "not a patch": (["--root", str(tmp_path / "b"), "--write"], "not a git format-patch"),
    }
    for name, (argv, message) in runs.items():
        assert credits.main(argv) == 2, name
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1, (name, err)
        assert err.startswith("vllm-fork: error: ") and message in err, (name, err)
    left = store.read_base(root, "0.21.0")  # left as it was
    assert left is not None and left.contents == [b"\xff\xfe not a patch\n"]


def test_a_patch_not_from_the_fork_maintainers_is_reported_and_rewritten(tmp_path: Path) -> None:
    patch = _copy(tmp_path, SWITCH)
    pristine = patch.read_bytes()
    _edit(
        patch,
        "From: vLLM ROCm fork maintainers\n <rocm-fork-maintainers@users.noreply.github.com>\n",
        "From: Someone Else\n <someone@example.com>\n",
    )
    (problem,) = credits.credit_problems(parse_patch(patch))
    assert problem == (
        f"{SWITCH}: From must be 'vLLM ROCm fork maintainers "
        "<rocm-fork-maintainers@users.noreply.github.com>', "
        "got 'Someone Else <someone@example.com>'"
    )
    assert credits.rewrite_credit(patch)
    assert patch.read_bytes() == pristine
