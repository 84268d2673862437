from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fork.errors import ConfigError, NotOnIndexError
from vllm_fork.sources.fetch import Fetcher
from vllm_fork.sources.pinner import pin_versions
from vllm_fork.sources.pins import dump_pins, load_pins, pick_wheel

from .conftest import FAKE_VERSION, ForkRepo, LocalIndex, make_sdist, sha256_of

WHEELS = [
    "vllm-0.21.0-cp38-abi3-manylinux_2_24_x86_64.whl",
    "vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64.whl",
    "vllm-0.21.0-1-cp38-abi3-manylinux_2_24_aarch64.whl",
    "vllm-0.21.0-cp38-abi3-macosx_11_0_arm64.whl",
    "vllm-0.21.1-cp38-abi3-manylinux_2_24_x86_64.whl",
    "vllm-0.21.0.tar.gz",
]


def test_pick_wheel_prefers_highest_build_tag() -> None:
    assert pick_wheel(WHEELS, "0.21.0") == "vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64.whl"
    assert pick_wheel(WHEELS[:1], "0.21.0") == WHEELS[0]
    assert pick_wheel(WHEELS, "0.22.0") is None
    two = [
        "vllm-1.0-2-py3-none-manylinux_2_28_x86_64.whl",
        "vllm-1.0-10-py3-none-manylinux_2_28_x86_64.whl",
    ]
    assert pick_wheel(two, "1.0") == two[1]  # build tags compare as numbers


def test_pin_from_index_is_sorted_and_stable(
    fork_repo: ForkRepo, local_index: LocalIndex, tmp_path: Path
) -> None:
    build = tmp_path / "more"
    build.mkdir()
    older = make_sdist(build, version="1.10.0")
    newer = make_sdist(build, version="1.9.0")
    wheel = build / "vllm-1.10.0-1-cp38-abi3-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"wheel bytes")
    plain = build / "vllm-1.10.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    plain.write_bytes(b"older build")
    local_index.publish(fork_repo.sdist, older, newer, wheel, plain)
    config = fork_repo.config
    pin_versions(config, Fetcher(config), ["1.10.0", "1.9.0"], supported=True, default=False)
    pins = load_pins(config.bases_file)
    assert pins.versions() == ["1.9.0", "1.10.0", FAKE_VERSION]
    assert pins.default == FAKE_VERSION
    base = pins.get("1.10.0")
    assert base.supported and base.sdist.sha256 == sha256_of(older)
    assert base.wheel is not None and base.wheel.filename == wheel.name
    assert base.wheel.sha256 == sha256_of(wheel)
    assert pins.get("1.9.0").wheel is None
    text = config.bases_file.read_text()
    assert dump_pins(load_pins(config.bases_file)) == text
    assert text.index('[bases."1.9.0"]') < text.index('[bases."1.10.0"]')

    # the wheel can then be fetched and verified like the sdist
    assert Fetcher(config).ensure(base.wheel).read_bytes() == b"wheel bytes"


def test_pin_unknown_release(fork_repo: ForkRepo) -> None:
    with pytest.raises(NotOnIndexError, match="vllm-7.0.0.tar.gz is not on"):
        pin_versions(
            fork_repo.config, Fetcher(fork_repo.config), ["7.0.0"], supported=False, default=False
        )


def test_bad_bases_toml(tmp_path: Path) -> None:
    bad = tmp_path / "bases.toml"
    bad.write_text('[bases."1.0".sdist]\nfilename = "x"\nsha256 = "nothex"\n')
    with pytest.raises(ConfigError, match="not a lowercase sha256"):
        load_pins(bad)
    bad.write_text('default = "2.0"\n')
    with pytest.raises(ConfigError, match="default base 2.0 is not pinned"):
        load_pins(bad)
