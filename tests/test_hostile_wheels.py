"""Hostile wheels: `verify` and `audit` give each one verdict and name every bad member.

Cases are generated from a real fork wheel of the synthetic base (the one the
build tests make, which passes `verify`): RECORD fields and encodings
mutated, members renamed, links and devices added, the provenance record
nested, bloated or mis-encoded, members that inflate far beyond their size or
are damaged. Each goes through the real command line in a subprocess under an
address-space limit smaller than the largest member: the verdict must be
exit 1 (never 70, never a crash or a kill), and every bad member must be named
in a finding line. The table in docs/reliability.md lists the classes
(:data:`CLASSES`, rendered by tests/test_faults.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import subprocess
import sys
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_fork import __version__
from vllm_fork.series.patches import load_series
from vllm_fork.sources.pins import load_pins
from vllm_fork.wheel.provenance import PACKAGE_PATH, make_record

from .buildutil import fork_wheel, make_series, pin_upstream_wheel, python_patch
from .conftest import FAKE_VERSION, ForkRepo
from .wheelutil import RawMember, deflated, write_raw_zip, zeros_member

VERSION = f"{FAKE_VERSION}+hardened.1"
MEMORY_LIMIT = 512 << 20  # address space of each command: less than the bomb inflates to
BOMB_BYTES = 1 << 30
SEED = 26

# class -> the verdict asserted for each of its cases (the docs table's outcome column)
VERDICT = "exit 1 (never 70); each bad member named in its own finding line; nothing extracted"
CLASSES = {
    "RECORD field": "a hash, size or row of RECORD that the wheel spec does not allow",
    "RECORD encoding": "RECORD not UTF-8, with NUL bytes, a CSV error, or missing",
    "member name": "'..', absolute, backslash, drive letter or control characters",
    "link or special member": "symlink, device or fifo members",
    "provenance JSON": "the provenance record or a release file nested, huge, not UTF-8",
    "high-ratio or damaged member": (
        f"a member inflating to {BOMB_BYTES >> 30} GiB from ~1 MiB, a lying header, "
        "a bad CRC, an unknown method, encryption, a truncated file"
    ),
}


@dataclass
class Case:
    cls: str
    name: str
    bad: list[str]  # what the verdict must name (member names, or a release file)
    path: Path | None = None
    commands: tuple[str, ...] = ("verify", "audit")


def b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def record_row(name: str, data: bytes) -> list[str]:
    return [name, "sha256=" + b64(hashlib.sha256(data).digest()), str(len(data))]


def csv_text(rows: list[list[str]]) -> bytes:
    import csv
    import io

    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


def shown(name: str) -> str:
    """How a report can write ``name`` on one line (quoted when it has control characters)."""
    return name if name.isprintable() else ascii(name)


class Source:
    """The members of the real wheel, to rebuild it with one thing changed."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        with zipfile.ZipFile(wheel) as zf:
            self.files = {i.filename: zf.read(i) for i in zf.infolist()}
        self.record = next(n for n in self.files if n.endswith(".dist-info/RECORD"))
        self.files.pop(self.record)
        self.n = 0

    def package_members(self) -> list[str]:
        return sorted(n for n in self.files if not n.startswith(self.record.split("/")[0]))

    def rows(self, files: dict[str, bytes]) -> list[list[str]]:
        return [record_row(n, d) for n, d in files.items()] + [[self.record, "", ""]]

    def build(
        self,
        files: dict[str, bytes] | None = None,
        *,
        record: bytes | None = None,
        without_record: bool = False,
        extra: tuple[RawMember, ...] = (),
        extra_rows: tuple[list[str], ...] = (),
        directory: Path,
    ) -> Path:
        """The wheel with ``files`` (default: the real ones), RECORD (default: true
        rows for ``files`` and ``extra_rows``) and raw ``extra`` members."""
        files = dict(self.files if files is None else files)
        if record is None:
            record = csv_text(self.rows(files) + list(extra_rows))
        members = [deflated(n, d) for n, d in files.items()]
        if not without_record:
            members.append(deflated(self.record, record))
        self.n += 1
        out = directory / f"{self.n:02d}" / self.wheel.name
        out.parent.mkdir(parents=True)
        return write_raw_zip(out, members + list(extra))


def placeholder_row(name: str) -> list[str]:
    """A well-formed RECORD row whose hash nobody computed (for members never read)."""
    return [name, "sha256=" + b64(b"\0" * 32), "0"]


def record_cases(src: Source, rng: random.Random, d: Path) -> list[Case]:
    cls = "RECORD field"
    target = rng.choice(src.package_members())
    data = src.files[target]
    good = record_row(target, data)
    value = good[1][len("sha256=") :]
    mutations: dict[str, list[str]] = {
        "hash algorithm md5": [target, "md5=" + value, good[2]],
        "hash with base64 padding": [target, good[1] + "=", good[2]],
        "hash in standard base64": [target, "sha256=+/" + value[2:], good[2]],
        "hash truncated": [target, good[1][:30], good[2]],
        "hash of other bytes": [target, "sha256=" + b64(hashlib.sha256(b"x").digest()), good[2]],
        "hash empty": [target, "", good[2]],
        "size not digits": [target, good[1], good[2] + "a"],
        "size in non-ASCII digits": [target, good[1], "\u0661\u0662"],
        "size negative": [target, good[1], "-" + good[2]],
        "row of 2 fields": [target, good[1]],
        "row of 4 fields": [*good, "extra"],
    }
    cases = []
    for name, row in mutations.items():
        rows = [r if r[0] != target else row for r in src.rows(src.files)]
        cases.append(Case(cls, name, [target], src.build(record=csv_text(rows), directory=d)))
    return cases


def encoding_cases(src: Source, rng: random.Random, d: Path) -> list[Case]:
    cls = "RECORD encoding"
    text = csv_text(src.rows(src.files)).decode()
    victim = rng.choice(src.package_members())
    latin = dict(src.files)
    latin["vllm/caf\u00e9.py"] = latin.pop(victim)
    latin_record = csv_text(src.rows(latin)).decode().encode("latin-1")
    huge = [*src.rows(src.files), ["vllm/" + "x" * 200_000 + ".py", "sha256=", "1"]]
    cases = [
        ("UTF-16", src.build(record=text.encode("utf-16"), directory=d)),
        ("Latin-1 path", src.build(latin, record=latin_record, directory=d)),
        ("NUL byte", src.build(record=text.replace(",", "\0,", 1).encode(), directory=d)),
        ("CSV field over the limit", src.build(record=csv_text(huge), directory=d)),
        ("RECORD missing", src.build(without_record=True, directory=d)),
    ]
    return [Case(cls, name, [src.record], path) for name, path in cases]


def name_cases(src: Source, rng: random.Random, d: Path) -> list[Case]:
    cls = "member name"
    names = [
        "../evil.py",
        "vllm/../../evil.py",
        "/tmp/evil.py",
        "vllm\\..\\..\\evil.py",
        "C:/evil.py",
        "vllm/evil\n.py",
    ]
    cases = []
    for new in names:
        files = dict(src.files)
        files[new] = files.pop(rng.choice(src.package_members()))
        cases.append(Case(cls, repr(new), [shown(new)], src.build(files, directory=d)))
    return cases


def special_cases(src: Source, rng: random.Random, d: Path) -> list[Case]:
    cls = "link or special member"
    target = rng.choice(src.package_members())
    kinds = {
        "symlink to /etc/passwd": ("vllm/passwd.py", 0o120777, b"/etc/passwd"),
        f"symlink over {target}": (target, 0o120777, b"../../../home/user/.bashrc"),
        "character device": ("vllm/tty", 0o020666, b""),
        "fifo": ("vllm/pipe", 0o010644, b""),
    }
    cases = []
    for name, (member, mode, data) in kinds.items():
        files = {n: b for n, b in src.files.items() if n != member}
        raw = deflated(member, data, external_attr=mode << 16)
        rows = (record_row(member, data),)
        path = src.build(files, extra=(raw,), extra_rows=rows, directory=d)
        cases.append(Case(cls, name, [member], path))
    return cases


def json_cases(src: Source, rng: random.Random, d: Path) -> list[Case]:
    cls = "provenance JSON"
    record = json.loads(src.files[PACKAGE_PATH])
    deep = 100_000
    documents = {
        f"arrays nested {deep} deep": b"[" * deep + b"]" * deep,
        f"objects nested {deep} deep": b'{"a":' * deep + b"1" + b"}" * deep,
        "objects nested 200 deep": json.dumps(
            {**record, "tool": _nest({"name": "vllm-fork"}, 200)}
        ).encode(),
        "17 MiB": json.dumps({**record, "pad": rng.randbytes(17 << 19).hex()}).encode(),
        "not UTF-8": json.dumps(record).replace("vllm-fork", "vllm-f\u00f6rk").encode("latin-1"),
        "a 5000-digit number": json.dumps(record)[:-1].encode() + b', "n": ' + b"9" * 5000 + b"}",
    }
    cases = []
    for name, doc in documents.items():
        files = {**src.files, PACKAGE_PATH: doc}
        cases.append(Case(cls, name, [PACKAGE_PATH], src.build(files, directory=d)))
    # release files beside a sound wheel: only verify reads them
    for name, doc in (
        ("SBOM nested 100000 deep", b"[" * deep + b"]" * deep),
        ("SBOM not UTF-8", b'{"bomFormat": "Cyclone\xff"}'),
    ):
        path = src.build(directory=d)
        sbom = path.with_name(path.name + ".cdx.json")
        sbom.write_bytes(doc)
        cases.append(Case(cls, name, [sbom.name], path, commands=("verify",)))
    return cases


def _nest(leaf: object, depth: int) -> object:
    for _ in range(depth):
        leaf = {"a": leaf}
    return leaf


def damage_cases(src: Source, rng: random.Random, d: Path) -> list[Case]:
    cls = "high-ratio or damaged member"
    target = rng.choice(src.package_members())
    data = src.files[target]
    files = {n: b for n, b in src.files.items() if n != target}
    row = (record_row(target, data),)
    bomb = zeros_member("vllm/bomb.bin", BOMB_BYTES)
    big = zeros_member(target, 64 << 20)
    lying = RawMember(target, big.payload, zlib_crc(data), len(data))
    good = deflated(target, data)
    flipped = bytearray(good.payload)
    flipped[len(flipped) // 2] ^= 0xFF
    members = {
        f"{BOMB_BYTES >> 30} GiB of zeros in ~1 MiB": (bomb, (placeholder_row(bomb.name),)),
        "header understates the size": (lying, row),
        "bad CRC": (RawMember(target, good.payload, good.crc ^ 1, good.size), row),
        "damaged deflate stream": (RawMember(target, bytes(flipped), good.crc, good.size), row),
        "unknown compression method": (RawMember(target, data, good.crc, len(data), 97), row),
        "encrypted": (RawMember(target, good.payload, good.crc, good.size, flags=1), row),
    }
    cases = []
    for name, (raw, rows) in members.items():
        base = src.files if raw.name == bomb.name else files
        path = src.build(base, extra=(raw,), extra_rows=rows, directory=d)
        cases.append(Case(cls, name, [raw.name], path))
    whole = src.build(directory=d)
    whole.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    cases.append(Case(cls, "truncated archive", [whole.name], whole))
    return cases


def zlib_crc(data: bytes) -> int:
    import zlib

    return zlib.crc32(data)


GENERATORS: list[Callable[[Source, random.Random, Path], list[Case]]] = [
    record_cases,
    encoding_cases,
    name_cases,
    special_cases,
    json_cases,
    damage_cases,
]


# The command line under RLIMIT_AS, set before the tool is imported (a wrapper, rather
# than preexec_fn, which is not safe while the test's threads start processes).
LIMITED = (
    "import resource, runpy, sys; limit = int(sys.argv.pop(1)); "
    "resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); sys.argv[0] = 'vllm-fork'; "
    "runpy.run_module('vllm_fork.cli.main', run_name='__main__')"
)


def run_cli(command: str, wheel: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LIMITED, str(MEMORY_LIMIT), command, str(wheel)],
        capture_output=True,
        text=True,
        env={**os.environ, "VLLM_FORK_OFFLINE": "1"},
        timeout=120,
    )


def judge(case: Case, command: str, proc: subprocess.CompletedProcess[str]) -> list[str]:
    """What is wrong with the verdict (empty: one verdict, exit 1, every bad member named)."""
    wrong = []
    where = f"{case.cls} / {case.name} / {command}"
    if proc.returncode != 1:
        wrong.append(f"{where}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    if "Traceback" in proc.stderr or "internal error" in proc.stderr:
        wrong.append(f"{where}: crashed: {proc.stderr.strip()[-300:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("MISMATCH", "  BAD"))]
    lines += [ln for ln in proc.stderr.splitlines() if ln.startswith("vllm-fork: error:")]
    for name in case.bad:
        if not any(name in ln for ln in lines):
            wrong.append(f"{where}: {name!r} is not named: {proc.stdout[-400:]}{proc.stderr}")
    return wrong


def verdict_line(proc: subprocess.CompletedProcess[str], name: str) -> str:
    for ln in proc.stdout.splitlines() + proc.stderr.splitlines():
        if name in ln and ln.startswith(("MISMATCH", "  BAD", "vllm-fork: error:")):
            return ln.strip()
    return "-"


@pytest.fixture
def real_wheel(fork_repo: ForkRepo, tmp_path: Path) -> Path:
    """A precompiled fork wheel of the synthetic base that passes `verify`."""
    pin_upstream_wheel(fork_repo, tmp_path / "upstream")
    tree = make_series(fork_repo, tmp_path, python_patch)
    record = make_record(
        base=load_pins(fork_repo.config.bases_file).get(FAKE_VERSION),
        series=load_series(fork_repo.series_dir()),
        version=VERSION,
        revision=1,
        mode="precompiled",
        device="cuda",
        tool_version=__version__,
    ).to_json()
    return fork_wheel(tmp_path / "real", record, tree, VERSION)


@pytest.mark.release  # the fuzz: run by `vllm-fork release-check`, not the test command
@pytest.mark.slow
def test_hostile_wheels_get_one_verdict(real_wheel: Path, tmp_path: Path) -> None:
    src = Source(real_wheel)
    rng = random.Random(SEED)
    cases = [case for generate in GENERATORS for case in generate(src, rng, tmp_path / "h")]
    assert {c.cls for c in cases} == set(CLASSES)
    # the unmutated rebuild is sound: each finding below comes from the mutation
    proc = run_cli("verify", src.build(directory=tmp_path / "h"))
    assert "MISMATCH" not in proc.stdout and "RECORD hashes of all files" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    jobs = [(case, command) for case in cases for command in case.commands]
    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = list(pool.map(lambda job: run_cli(job[1], job[0].path), jobs))
    wrong: list[str] = []
    print(f"\n{len(cases)} hostile wheels in {len(CLASSES)} classes, {len(jobs)} runs")
    for (case, command), proc in zip(jobs, procs, strict=True):
        wrong += judge(case, command, proc)
        print(f"{case.cls} / {case.name} / {command}: {verdict_line(proc, case.bad[0])}")
    assert not wrong, "\n".join(wrong)
