"""Pinning upstream's ROCm wheel from an index the user names, and the hostile cases."""

from __future__ import annotations

import http.server
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import HashMismatchError
from vllm_fork.series.forkversion import check_fork_version, fork_version, rocm_variant
from vllm_fork.sources.pins import dump_pins, load_pins, rocm_version_of
from vllm_fork.sources.rocm import RocmPinError, ensure_rocm_wheel, pin_rocm
from vllm_fork.wheel.plan import REFUSED_INDEX, ROCM_VIEW, plan_build

from .conftest import FAKE_VERSION, ForkRepo
from .rocmwheel import serve, sha256_of, write_index

TAG = "cp312-cp312-manylinux_2_34_x86_64"


def wheel_file(directory: Path, name: str, data: bytes | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(data if data is not None else f"bytes of {name}".encode())
    return path


@pytest.fixture
def rocm_index(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(root, simple URL) of an index served from 127.0.0.1; fill it with write_index."""
    root = tmp_path / "rocm-index"
    root.mkdir()
    server: http.server.ThreadingHTTPServer
    server, url = serve(root)
    try:
        yield root, url
    finally:
        server.shutdown()
        server.server_close()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_variant_labels() -> None:
    assert rocm_version_of("rocm700") == "7.0.0"
    assert rocm_version_of("rocm6410") == "6.4.10"
    assert rocm_version_of("cu128") is None
    v = fork_version("0.21.0", 6, left_out=True, rocm="rocm700")
    assert v == "0.21.0+hardened.6.rocm700.nofull"
    assert check_fork_version(v) == ("0.21.0", 6) and rocm_variant(v) == "rocm700"
    assert rocm_variant("0.21.0+hardened.6.nofull") is None


def test_pin_from_index_then_fetch_verified(
    fork_repo: ForkRepo, rocm_index: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = rocm_index
    wheel = wheel_file(tmp_path / "w", f"vllm-{FAKE_VERSION}+rocm700-{TAG}.whl")
    other = wheel_file(tmp_path / "w", f"vllm-9.9.8+rocm700-{TAG}.whl")
    write_index(root, [wheel, other])
    config = fork_repo.config
    pins, pin = pin_rocm(config, config.fetcher, FAKE_VERSION, index=url)
    assert (pin.variant, pin.filename, pin.sha256) == ("rocm700", wheel.name, sha256_of(wheel))
    assert (pin.rocm, pin.python, pin.index) == ("7.0.0", "cp312", url)
    reloaded = load_pins(config.bases_file)
    assert reloaded.get(FAKE_VERSION).rocm == (pin,)
    assert dump_pins(reloaded) == config.bases_file.read_text()
    # the build's fetch: downloaded from the pinned index into the verified cache
    path = ensure_rocm_wheel(config, pin)
    assert path.parent == config.dist_dir and path.read_bytes() == wheel.read_bytes()


def test_hash_mismatch_is_refused(
    fork_repo: ForkRepo, rocm_index: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = rocm_index
    wheel = wheel_file(tmp_path / "w", f"vllm-{FAKE_VERSION}+rocm700-{TAG}.whl")
    write_index(root, [wheel])
    config = fork_repo.config
    _, pin = pin_rocm(config, config.fetcher, FAKE_VERSION, index=url)
    # the index now serves other bytes under the pinned name
    (root / "files" / wheel.name).write_bytes(b"something else")
    expected = "sha256 mismatch for " + re.escape(wheel.name)
    with pytest.raises(HashMismatchError, match=expected) as exc:
        ensure_rocm_wheel(config, pin)
    print(f"vllm-fork: error: {exc.value}")
    assert not (config.dist_dir / wheel.name).exists()


@pytest.mark.parametrize(
    ("names", "argv", "message"),
    [
        (
            [f"vllm-9.9.8+rocm700-{TAG}.whl", f"vllm-10.0.0+rocm700-{TAG}.whl"],
            [],
            "no ROCm wheel of vLLM 9.9.9 at .*; it has ROCm wheels of 9.9.8, 10.0.0",
        ),
        (
            [f"vllm-{FAKE_VERSION}+rocm700-cp311-cp311-manylinux_2_34_x86_64.whl"],
            [],
            "no cp312 ROCm wheel of vLLM 9.9.9 at .*; available for 9.9.9: "
            r"vllm-9\.9\.9\+rocm700-cp311",
        ),
        (
            [f"vllm-{FAKE_VERSION}+rocm700-{TAG}.whl", f"vllm-{FAKE_VERSION}+rocm643-{TAG}.whl"],
            [],
            r"several ROCm variants of vLLM 9\.9\.9 for cp312 \(rocm643, rocm700\): "
            "choose one with --rocm-variant",
        ),
        (
            [f"vllm-{FAKE_VERSION}+rocm700-{TAG}.whl"],
            ["--rocm-variant", "rocm710"],
            "no rocm710 wheel of vLLM 9.9.9 for cp312 .* available variants: rocm700",
        ),
    ],
    ids=["other-version", "other-python", "several-variants", "unknown-variant"],
)
def test_hostile_indexes_one_line_error(
    capsys: pytest.CaptureFixture[str],
    fork_repo: ForkRepo,
    rocm_index: tuple[Path, str],
    tmp_path: Path,
    names: list[str],
    argv: list[str],
    message: str,
) -> None:
    root, url = rocm_index
    write_index(root, [wheel_file(tmp_path / "w", n) for n in names])
    before = fork_repo.config.bases_file.read_text()
    code, out, err = run(capsys, "pin", FAKE_VERSION, "--rocm-index", url, *argv)
    print(err)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("vllm-fork: error: ")
    assert re.search(message, err), err
    assert fork_repo.config.bases_file.read_text() == before  # nothing recorded


def test_several_variants_pinned_by_choice(
    fork_repo: ForkRepo, rocm_index: tuple[Path, str], tmp_path: Path
) -> None:
    root, url = rocm_index
    names = [f"vllm-{FAKE_VERSION}+rocm700-{TAG}.whl", f"vllm-{FAKE_VERSION}+rocm643-{TAG}.whl"]
    write_index(root, [wheel_file(tmp_path / "w", n) for n in names])
    config = fork_repo.config
    for variant in ("rocm700", "rocm643"):
        pin_rocm(config, config.fetcher, FAKE_VERSION, index=url, variant=variant)
    base = load_pins(config.bases_file).get(FAKE_VERSION)
    assert [p.variant for p in base.rocm] == ["rocm643", "rocm700"]
    assert base.rocm_pin("rocm643").rocm == "6.4.3"
    with pytest.raises(RocmPinError.__mro__[1], match="several ROCm variants.*--rocm-variant"):
        base.rocm_pin(None)


def test_local_wheel_and_directory(fork_repo: ForkRepo, tmp_path: Path) -> None:
    """A wheel the user has (or a flat directory of them) is hashed here and stored in
    the verified cache: the build needs no index."""
    config = fork_repo.config
    wheel = wheel_file(tmp_path / "mine", f"vllm-{FAKE_VERSION}+rocm700-{TAG}.whl")
    _, pin = pin_rocm(config, config.fetcher, FAKE_VERSION, wheel=wheel)
    assert pin.index is None and pin.sha256 == sha256_of(wheel)
    assert (config.dist_dir / wheel.name).read_bytes() == wheel.read_bytes()
    assert ensure_rocm_wheel(config, pin) == config.dist_dir / wheel.name
    wheel_file(tmp_path / "mine", f"vllm-{FAKE_VERSION}+rocm710-{TAG}.whl")
    with pytest.raises(RocmPinError, match="several ROCm variants"):
        pin_rocm(config, config.fetcher, FAKE_VERSION, index=str(tmp_path / "mine"))
    _, pin2 = pin_rocm(
        config, config.fetcher, FAKE_VERSION, index=str(tmp_path / "mine"), variant="rocm710"
    )
    assert [p.variant for p in load_pins(config.bases_file).get(FAKE_VERSION).rocm] == [
        "rocm700",
        "rocm710",
    ]
    assert pin2.rocm == "7.1.0"


def test_not_a_rocm_wheel(capsys: pytest.CaptureFixture[str], fork_repo: ForkRepo, tmp_path: Path):
    cuda = wheel_file(tmp_path, f"vllm-{FAKE_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl")
    code, _, err = run(capsys, "pin", FAKE_VERSION, "--rocm-wheel", str(cuda))
    assert code == 2 and "is not a ROCm wheel of vLLM" in err


def test_build_without_rocm_pin_says_how_to_add_one(
    capsys: pytest.CaptureFixture[str], fork_repo: ForkRepo
) -> None:
    from .buildutil import make_series, pin_upstream_wheel, python_patch

    make_series(fork_repo, fork_repo.root.parent, python_patch)
    pin_upstream_wheel(fork_repo, fork_repo.root.parent / "up")
    code, out, err = run(capsys, "build", "--device", "rocm", "--dry-run")
    print(err)
    assert code == 2 and out == ""
    assert f"pins no upstream ROCm wheel for {FAKE_VERSION}" in err
    assert f"vllm-fork pin {FAKE_VERSION} --rocm-index URL" in err


def test_precompiled_rocm_plan_hands_the_wheel_by_file(tmp_path: Path) -> None:
    wheel = tmp_path / f"vllm-1.0+rocm700-{TAG}.whl"
    plan = plan_build(
        mode="precompiled",
        device="rocm",
        python="python",
        tree=tmp_path,
        out_dir=tmp_path / "dist",
        version="1.0+hardened.1.rocm700",
        source_date_epoch=0,
        plat_name="manylinux_2_34_x86_64",
        upstream_wheel=wheel,
        rocm_version="7.0.0",
    )
    env = plan.environ({"VLLM_ROCM_WHEEL_INDEX": "https://pypi.amd.com/vllm-rocm/simple"})
    assert env["VLLM_PRECOMPILED_WHEEL_LOCATION"] == str(wheel)
    assert (env["VLLM_TARGET_DEVICE"], env["VLLM_USE_PRECOMPILED"]) == ("rocm", "1")
    assert env["VLLM_ROCM_WHEEL_INDEX"] == REFUSED_INDEX  # no index look-up can succeed
    assert env["PYTHONPATH"] == str(ROCM_VIEW) and env["VLLM_FORK_TORCH_HIP"] == "7.0.0"
    assert (ROCM_VIEW / "sitecustomize.py").is_file()


def rocm_record() -> dict:
    up = f"vllm-{FAKE_VERSION}+rocm700-{TAG}.whl"
    return {
        "schema": 1,
        "version": f"{FAKE_VERSION}+hardened.1.rocm700",
        "base": {
            "version": FAKE_VERSION,
            "sdist": {"filename": "s.tar.gz", "sha256": "cd" * 32},
            "upstream_wheel": {"filename": up, "sha256": "ab" * 32},
        },
        "build": {
            "mode": "precompiled",
            "device": "rocm",
            "rocm": {
                "variant": "rocm700",
                "rocm_version": "7.0.0",
                "python": "cp312",
                "aiter": "v0.1.13",
            },
        },
        "tool": {"name": "vllm-fork", "version": "0"},
        "series": {"revision": 1, "patches": [], "left_out": []},
    }


def test_rocm_facts_in_record_sbom_statement_and_notes() -> None:
    from vllm_fork.deploy import attestation, notes, sbom
    from vllm_fork.wheel.provenance import Provenance, format_record

    record = rocm_record()
    parsed = Provenance.from_json(record)
    assert parsed.rocm is not None and parsed.rocm.aiter == "v0.1.13"
    assert parsed.to_json()["build"]["rocm"] == record["build"]["rocm"]
    assert "rocm700 (ROCm 7.0.0, cp312), AITER v0.1.13" in format_record(parsed)

    name, digest = f"vllm-{record['version']}-{TAG}.whl", "12" * 32
    text = sbom.make_sbom(record, wheel_name=name, wheel_sha256=digest, environment={})
    pins = {"sdist": record["base"]["sdist"], "upstream_wheel": record["base"]["upstream_wheel"]}
    assert (
        sbom.check_sbom(text, record=record, wheel_name=name, wheel_sha256=digest, pins=pins) == []
    )
    # a record that names another AITER tag than the SBOM is caught
    other = rocm_record()
    other["build"]["rocm"]["aiter"] = "v0.1.12"
    problems = sbom.check_sbom(text, record=other, wheel_name=name, wheel_sha256=digest, pins=pins)
    assert problems == ["aiter-tag v0.1.13, record v0.1.12"]

    statement = attestation.make_statement(
        record, wheel_name=name, wheel_sha256=digest, environment={}
    )
    params = statement["predicate"]["buildDefinition"]["externalParameters"]
    assert params["rocm"] == record["build"]["rocm"]

    md = notes.make_notes(record, wheel_name=name, wheel_sha256=digest)
    assert "rocm700, ROCm 7.0.0, cp312 only; AITER v0.1.13" in md
