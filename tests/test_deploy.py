"""SBOM, provenance statement and release notes beside a wheel, and `verify` on them."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from vllm_fork.cli.main import main
from vllm_fork.deploy.attestation import SUFFIX as PROV
from vllm_fork.deploy.attestation import series_digest
from vllm_fork.deploy.notes import SUFFIX as NOTES
from vllm_fork.deploy.notes import make_notes
from vllm_fork.deploy.release_files import sidecar, verify_release, write_release_files
from vllm_fork.deploy.sbom import SUFFIX as SBOM
from vllm_fork.deploy.sbom import validate
from vllm_fork.facts import registry
from vllm_fork.hashing import sha256_file
from vllm_fork.probes import Finding

from .buildutil import make_series, pin_upstream_wheel, python_patch
from .conftest import FAKE_VERSION, ForkRepo
from .test_build_provenance import fork_wheel, record_for

ENV = {"python": "3.11", "torch": "2.11.0", "setuptools": "80.10.2", "build-backend": "x"}


@pytest.fixture
def series_repo(fork_repo: ForkRepo, tmp_path: Path) -> ForkRepo:
    pin_upstream_wheel(fork_repo, tmp_path / "upstream")
    make_series(fork_repo, tmp_path, python_patch)
    return fork_repo


def released(repo: ForkRepo, directory: Path, key: Path | None = None) -> Path:
    directory.mkdir(exist_ok=True)
    record = record_for(repo)
    wheel = fork_wheel(directory, record, tree=repo.root.parent / "wt")
    write_release_files(wheel, record, ENV, sdist_url="file:///index/sdist.tar.gz", signing_key=key)
    return wheel


def make_key(tmp_path: Path) -> tuple[Path, Path]:
    key = Ed25519PrivateKey.generate()
    private = tmp_path / "key.pem"
    public = tmp_path / "key.pub.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def test_sbom_content_is_valid_cyclonedx(series_repo: ForkRepo, tmp_path: Path) -> None:
    wheel = released(series_repo, tmp_path / "d")
    text = sidecar(wheel, SBOM).read_text()
    assert validate(text) is None
    doc = json.loads(text)
    record = record_for(series_repo)
    comp = doc["metadata"]["component"]
    assert comp["version"] == record["version"]
    assert comp["hashes"] == [{"alg": "SHA-256", "content": sha256_file(wheel)}]
    props = {p["name"]: p["value"] for p in comp["properties"]}
    assert props["vllm-fork:build-mode"] == "precompiled"
    assert props["vllm-fork:build-env:torch"] == "2.11.0"
    assert props["vllm-fork:build-env:build-backend"] == "x"
    assert doc["metadata"]["tools"]["components"][0]["name"] == "vllm-fork"
    by_ref = {c["bom-ref"]: c for c in doc["components"]}
    sdist = by_ref["upstream-sdist"]
    assert sdist["version"] == FAKE_VERSION
    assert sdist["hashes"][0]["content"] == record["base"]["sdist"]["sha256"]
    assert sdist["externalReferences"][0]["url"] == "file:///index/sdist.tar.gz"
    (patch,) = record["series"]["patches"]
    listed = by_ref[f"patch:{patch['file']}"]
    assert listed["hashes"][0]["content"] == patch["sha256"]
    props = {p["name"]: p["value"] for p in listed["properties"]}
    assert props["vllm-fork:change"] == "ar-rms-pack-gate"
    assert props["vllm-fork:upstream-pr"] == patch["upstream_pr"]
    # an invalid document is reported
    doc["components"][0]["type"] = "not-a-type"
    assert validate(json.dumps(doc)) is not None


def test_verify_checks_release_files(series_repo: ForkRepo, tmp_path: Path) -> None:
    wheel = released(series_repo, tmp_path / "d")
    report = verify_release(series_repo.config, wheel, require_release_files=True)
    assert report.passed, report.format()
    assert any(line.startswith("SBOM ") for line in report.ok)
    assert any("provenance " in line and "(unsigned)" in line for line in report.ok)


def test_verify_rejects_tampered_sbom(
    series_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = released(series_repo, tmp_path / "d")
    path = sidecar(wheel, SBOM)
    doc = json.loads(path.read_text())
    patch = next(c for c in doc["components"] if c["bom-ref"].startswith("patch:"))
    patch["hashes"][0]["content"] = "0" * 64
    path.write_text(json.dumps(doc))
    assert main(["verify", str(wheel)]) == 1
    out = capsys.readouterr().out
    print(out)
    assert "MISMATCH  SBOM" in out and "patches differ from the wheel's record" in out
    # the sdist against the pins
    doc = json.loads(sidecar(released(series_repo, tmp_path / "e"), SBOM).read_text())
    sdist = next(c for c in doc["components"] if c["bom-ref"] == "upstream-sdist")
    sdist["hashes"][0]["content"] = "1" * 64
    path.write_text(json.dumps(doc))
    report = verify_release(series_repo.config, wheel)
    assert any("bases.toml pins" in b for b in report.bad), report.format()


def test_verify_rejects_sbom_of_another_wheel(series_repo: ForkRepo, tmp_path: Path) -> None:
    wheel = released(series_repo, tmp_path / "d")
    # the wheel is rebuilt with other bytes, its release files are kept
    with open(wheel, "ab") as fh:
        fh.write(b"\0")
    report = verify_release(series_repo.config, wheel)
    assert any("SBOM" in b and "wheel sha256" in b for b in report.bad), report.format()
    assert any("provenance" in b and "subject" in b for b in report.bad), report.format()


def test_verify_rejects_tampered_provenance_subject(
    series_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = released(series_repo, tmp_path / "d")
    path = sidecar(wheel, PROV)
    statement = json.loads(path.read_text())
    assert statement["subject"] == [{"name": wheel.name, "digest": {"sha256": sha256_file(wheel)}}]
    deps = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    series = next(d for d in deps if d["name"].startswith("series/"))
    assert series["digest"]["sha256"] == series_digest(record_for(series_repo)["series"]["patches"])
    statement["subject"][0]["digest"]["sha256"] = "f" * 64
    path.write_text(json.dumps(statement))
    assert main(["verify", str(wheel)]) == 1
    out = capsys.readouterr().out
    print(out)
    assert "MISMATCH  provenance statement" in out and "is not this wheel" in out


def test_signed_provenance(series_repo: ForkRepo, tmp_path: Path) -> None:
    private, public = make_key(tmp_path)
    wheel = released(series_repo, tmp_path / "d", key=private)
    envelope = json.loads(sidecar(wheel, PROV).read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    config = series_repo.config
    report = verify_release(config, wheel, public_key=public)
    assert report.passed, report.format()
    assert any("signature by" in line and "valid" in line for line in report.ok)
    # a signature nobody checks is not a pass
    assert any("no public key" in b for b in verify_release(config, wheel).bad)
    # another key
    (tmp_path / "other").mkdir()
    _, other = make_key(tmp_path / "other")
    bad = verify_release(config, wheel, public_key=other).bad
    assert any("no valid signature" in b for b in bad)
    # a payload changed after signing
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["runDetails"]["builder"]["id"] = "urn:someone-else"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    sidecar(wheel, PROV).write_text(json.dumps(envelope))
    assert any(
        "no valid signature" in b for b in verify_release(config, wheel, public_key=public).bad
    )


def test_missing_release_files_fail_only_when_required(
    series_repo: ForkRepo, tmp_path: Path
) -> None:
    wheel = released(series_repo, tmp_path / "d")
    sidecar(wheel, SBOM).unlink()
    assert verify_release(series_repo.config, wheel).passed
    report = verify_release(series_repo.config, wheel, require_release_files=True)
    assert any("not found beside the wheel" in b for b in report.bad)


def test_release_notes(series_repo: ForkRepo, tmp_path: Path) -> None:
    record = record_for(series_repo)
    previous = json.loads(json.dumps(record))
    previous["version"] = f"{FAKE_VERSION}+hardened.0"
    previous["series"]["patches"] = []
    gate = registry.get("ar-rms-pack-gate")
    item = gate.hardening[0]
    findings = {
        "ar-rms-pack-gate": Finding("present", "gate by pack", {item.id: False}),
        "dsv32-decode": Finding("absent", "no metadata cache"),
    }
    base = {
        "ar-rms-pack-gate": Finding("absent", "whitelist gate"),
        "dsv32-decode": Finding("absent", "no metadata cache"),
    }
    text = make_notes(
        record,
        wheel_name="w.whl",
        wheel_sha256="ab" * 32,
        previous=previous,
        findings=findings,
        base_findings=base,
    )
    print(text)
    patch = record["series"]["patches"][0]
    assert text.startswith(f"# vLLM {record['version']} (hardened fork)\n")
    assert f"- **Base**: vLLM {FAKE_VERSION}" in text
    assert f"- **Wheel**: `w.whl` (sha256 `{'ab' * 32}`)" in text
    # the state rule on the probes of base and built tree
    assert (
        f"| ar-rms-pack-gate: {gate.title} | carried (gate by pack) | carried | "
        f"{patch['upstream_pr']} |" in text
    )
    assert "| dsv32-decode: " in text and "| missing (no metadata cache) | none |" in text
    assert f"- ar-rms-pack-gate / {item.id}: {item.description} (not in this build)" in text
    assert f"| `{patch['file']}` | ar-rms-pack-gate | change | `{patch['sha256'][:16]}` |" in text
    assert f"Compared with {FAKE_VERSION}+hardened.0:" in text
    assert f"- added `{patch['file']}` (ar-rms-pack-gate, change)" in text
    assert "- ar-rms-pack-gate: not in the series -> carried" in text
    # written beside the wheel by the build, comparing with the older wheel beside it
    older = fork_wheel(
        tmp_path, previous, version=previous["version"], tree=series_repo.root.parent / "wt"
    )
    wheel = released(series_repo, tmp_path)
    assert older.parent == wheel.parent
    written = sidecar(wheel, NOTES).read_text()
    assert f"Compared with {FAKE_VERSION}+hardened.0:" in written
    assert main(["release-notes", str(wheel)]) == 0


def test_build_refuses_a_bad_signing_key_before_any_work(
    series_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key\n")
    argv = ["build", "--mode", "empty", "-o", str(tmp_path / "dist"), "--signing-key", str(bad)]
    assert main(argv) == 2
    assert "cannot read the signing key" in capsys.readouterr().err
    work = series_repo.config.cache.work
    assert not work.exists() or not any(work.iterdir())


def test_notes_list_the_left_out_change_as_not_in_this_build() -> None:
    record = {
        "version": f"{FAKE_VERSION}+hardened.2.nofull",
        "base": {"version": FAKE_VERSION, "sdist": {"filename": "s.tar.gz", "sha256": "cd" * 32}},
        "build": {"mode": "precompiled", "device": "cuda"},
        "tool": {"name": "vllm-fork", "version": "0"},
        "series": {
            "revision": 2,
            "patches": [
                {
                    "file": "0001-a.patch",
                    "change": "ar-rms-pack-gate",
                    "part": "change",
                    "sha256": "ef" * 32,
                    "upstream_pr": None,
                }
            ],
            "left_out": [
                {
                    "file": "0002-fast.patch",
                    "change": "rope-fast-kernel",
                    "build": "full",
                    "sha256": "01" * 32,
                }
            ],
        },
    }
    text = make_notes(record, wheel_name="w.whl", wheel_sha256="ab" * 32)
    fast = registry.get("rope-fast-kernel")
    assert (
        f"| rope-fast-kernel: {fast.title} | not in this build (full build only) | none | "
        "vendor change |" in text
    )
    assert "## Not in this build" in text
    assert "- `0002-fast.patch` (rope-fast-kernel): not in this build" in text
    # a full build's record has nothing left out and no such section
    record["series"]["left_out"] = []
    assert "Not in this build" not in make_notes(record, wheel_name="w.whl", wheel_sha256="ab" * 32)
