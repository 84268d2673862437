"""docker/Dockerfile.rocm-hardened, linted with dockerfile-parse (no container engine runs here)."""

from __future__ import annotations

import io
import re
from pathlib import Path

from dockerfile_parse import DockerfileParser

from vllm_fork.wheel.provenance import PACKAGE_PATH

DOCKERFILE = Path(__file__).resolve().parents[1] / "docker" / "Dockerfile.rocm-hardened"


def parsed() -> DockerfileParser:
    return DockerfileParser(fileobj=io.BytesIO(DOCKERFILE.read_bytes()))


def instructions() -> list[dict]:
    return [i for i in parsed().structure if i["instruction"] != "COMMENT"]


def test_derives_from_upstream_rocm_image_given_as_argument() -> None:
    df = parsed()
    first = instructions()[0]
    assert first["instruction"] == "ARG" and first["value"].startswith("VLLM_ROCM_IMAGE=")
    froms = [i for i in instructions() if i["instruction"] == "FROM"]
    assert [f["value"] for f in froms] == ["${VLLM_ROCM_IMAGE}"]  # one stage, no other base
    assert "docker/Dockerfile.rocm" in DOCKERFILE.read_text()
    assert not df.baseimage.endswith(":latest")


def test_installs_the_pinned_fork_wheel_without_touching_torch() -> None:
    runs = [i["value"] for i in instructions() if i["instruction"] == "RUN"]
    install = next(r for r in runs if "pip install" in r)
    assert '"vllm==${VLLM_FORK_VERSION}"' in install
    assert "--no-deps" in install and "--constraint" in install
    assert '--index-url "${INDEX_URL}"' in install
    assert "pip check" in install
    args = dict(
        a.split("=", 1) for a in (i["value"] for i in instructions() if i["instruction"] == "ARG")
    )
    assert re.fullmatch(r"[0-9.]+\+hardened\.[0-9]+", args["VLLM_FORK_VERSION"])
    # the version default follows the base of the image default
    assert args["VLLM_ROCM_IMAGE"].endswith(":" + args["VLLM_FORK_VERSION"].split("+")[0])
    assert any(Path(PACKAGE_PATH).name in r for r in runs)


def test_no_remote_add_and_no_shell_form_pitfalls() -> None:
    for i in instructions():
        assert i["instruction"] in {"ARG", "FROM", "RUN", "LABEL", "ENV"}, i
        if i["instruction"] == "RUN":
            assert "curl" not in i["value"] and "wget" not in i["value"]
            assert "sudo" not in i["value"]
