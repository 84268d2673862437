"""The CycloneDX SBOM written beside each wheel: ``<wheel>.cdx.json``.

It describes the wheel (name, version, sha256) and what went into it: the
upstream sdist (name, version, sha256, where it was downloaded from), the
upstream wheel whose binaries a precompiled build reuses, each patch (file,
sha256, change id, part, upstream PR), the tool version, the build mode and
device, and the versions of torch and the build backend in the build
environment. The data comes from the wheel's provenance record (one source
of truth); the document is made and validated with cyclonedx-python-lib.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from cyclonedx.model import (
    ExternalReference,
    ExternalReferenceType,
    HashAlgorithm,
    HashType,
    Property,
    XsUri,
)
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL

log = logging.getLogger(__name__)

SUFFIX = ".cdx.json"
PROP = "vllm-fork:"  # prefix of our property names
WHEEL_REF = "fork-wheel"
SDIST_REF = "upstream-sdist"
UPSTREAM_WHEEL_REF = "upstream-wheel"
TOOL_REF = "vllm-fork"


def _sha(value: str) -> list[HashType]:
    return [HashType(alg=HashAlgorithm.SHA_256, content=value)]


def _props(values: dict[str, str | None]) -> list[Property]:
    return [Property(name=PROP + k, value=v) for k, v in values.items() if v]


def _rocm_props(record: dict[str, Any]) -> dict[str, str | None]:
    """The ROCm facts of a build on upstream's ROCm wheel (none for other builds)."""
    rocm = record["build"].get("rocm")
    if not rocm:
        return {}
    return {
        "rocm-variant": rocm["variant"],
        "rocm-version": rocm["rocm_version"],
        "rocm-python": rocm["python"],
        "aiter-tag": rocm.get("aiter"),
    }


def make_sbom(
    record: dict[str, Any],
    *,
    wheel_name: str,
    wheel_sha256: str,
    environment: dict[str, str | None],
    sdist_url: str | None = None,
) -> str:
    """The SBOM (CycloneDX 1.6 JSON) of the wheel ``wheel_name`` built as ``record`` says.

    ``environment``: versions in the build environment (python, torch,
    setuptools, build-backend...).
    """
    base = record["base"]
    tool = record["tool"]
    # the same wheel always gets the same serial number
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"{wheel_name}#{wheel_sha256}"))
    bom.metadata.tools.components.add(
        Component(
            type=ComponentType.APPLICATION,
            name=tool["name"],
            version=tool["version"],
            bom_ref=TOOL_REF,
        )
    )
    wheel = Component(
        type=ComponentType.LIBRARY,
        name="vllm",
        version=record["version"],
        bom_ref=WHEEL_REF,
        purl=PackageURL("pypi", None, "vllm", record["version"], {"file_name": wheel_name}),
        hashes=_sha(wheel_sha256),
        properties=_props(
            {
                "build-mode": record["build"]["mode"],
                "build-device": record["build"]["device"],
                "series-revision": str(record["series"]["revision"]),
                **_rocm_props(record),
                **{f"build-env:{k}": v for k, v in sorted(environment.items())},
            }
        ),
    )
    bom.metadata.component = wheel
    sdist = base["sdist"]
    refs = []
    if sdist_url:
        refs.append(
            ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(sdist_url))
        )
    bom.components.add(
        Component(
            type=ComponentType.LIBRARY,
            name="vllm",
            version=base["version"],
            bom_ref=SDIST_REF,
            purl=PackageURL(
                "pypi", None, "vllm", base["version"], {"file_name": sdist["filename"]}
            ),
            hashes=_sha(sdist["sha256"]),
            external_references=refs,
            properties=_props({"role": "upstream-sdist"}),
        )
    )
    upstream_wheel = base.get("upstream_wheel")
    if upstream_wheel:
        bom.components.add(
            Component(
                type=ComponentType.LIBRARY,
                name="vllm",
                version=base["version"],
                bom_ref=UPSTREAM_WHEEL_REF,
                purl=PackageURL(
                    "pypi", None, "vllm", base["version"], {"file_name": upstream_wheel["filename"]}
                ),
                hashes=_sha(upstream_wheel["sha256"]),
                properties=_props({"role": "upstream-binaries"}),
            )
        )
    for patch in record["series"]["patches"]:
        pr = patch.get("upstream_pr")
        bom.components.add(
            Component(
                type=ComponentType.FILE,
                name=patch["file"],
                bom_ref=f"patch:{patch['file']}",
                hashes=_sha(patch["sha256"]),
                external_references=[
                    ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(pr))
                ]
                if pr
                else [],
                properties=_props(
                    {
                        "role": "patch",
                        "change": patch["change"],
                        "part": patch.get("part"),
                        "upstream-pr": pr,
                    }
                ),
            )
        )
    bom.register_dependency(wheel, list(bom.components))
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    problem = validate(text)
    if problem:  # a bug of ours, never the user's input
        raise RuntimeError(f"the generated SBOM does not validate: {problem}")
    return text + "\n"


def validate(text: str) -> str | None:
    """None when ``text`` is a valid CycloneDX 1.6 JSON document, else the first error."""
    # the validator loads jsonschema's format checkers (seconds of CPU): only when needed
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    return None if error is None else str(error).splitlines()[0]


# --- reading it back (verify) ---------------------------------------------------


def _sha_of(component: dict[str, Any]) -> str | None:
    for h in component.get("hashes", []):
        if h.get("alg") == "SHA-256":
            return h.get("content")
    return None


def _prop(component: dict[str, Any], name: str) -> str | None:
    for p in component.get("properties", []):
        if p.get("name") == PROP + name:
            return p.get("value")
    return None


def _file_name(component: dict[str, Any]) -> str | None:
    try:
        return PackageURL.from_string(component.get("purl", "")).qualifiers.get("file_name")
    except ValueError:
        return None


def check_sbom(
    text: str, *, record: dict[str, Any], wheel_name: str, wheel_sha256: str, pins: dict[str, Any]
) -> list[str]:
    """Mismatches between the SBOM and the wheel, its record and the pins (empty: all agree).

    ``pins``: the ``base`` part of a record made from bases.toml (sdist, upstream_wheel).
    """
    problem = validate(text)
    if problem:
        return [f"not a valid CycloneDX 1.6 document: {problem}"]
    doc = json.loads(text)
    bad: list[str] = []
    meta = doc.get("metadata", {})
    wheel = meta.get("component", {})
    if _sha_of(wheel) != wheel_sha256:
        bad.append(f"wheel sha256 is {_sha_of(wheel)}, the wheel's is {wheel_sha256}")
    if wheel.get("version") != record["version"]:
        bad.append(f"version is {wheel.get('version')}, the wheel's is {record['version']}")
    if _file_name(wheel) != wheel_name:
        bad.append(f"purl {wheel.get('purl')} does not name {wheel_name}")
    for name, value in _rocm_props(record).items():
        if _prop(wheel, name) != value:
            bad.append(f"{name} {_prop(wheel, name)}, record {value}")
    if _prop(wheel, "build-mode") != record["build"]["mode"]:
        bad.append(f"build mode {_prop(wheel, 'build-mode')}, record {record['build']['mode']}")
    tools = {c.get("name"): c.get("version") for c in meta.get("tools", {}).get("components", [])}
    if tools.get(record["tool"]["name"]) != record["tool"]["version"]:
        bad.append(f"tool version {tools.get('vllm-fork')}, record {record['tool']['version']}")
    comps = {c.get("bom-ref"): c for c in doc.get("components", [])}
    sdist = comps.get(SDIST_REF, {})
    want = pins["sdist"]
    if (sdist.get("version"), _sha_of(sdist)) != (record["base"]["version"], want["sha256"]):
        bad.append(
            f"upstream sdist {sdist.get('version')} sha256 {_sha_of(sdist)}, bases.toml pins "
            f"{record['base']['version']} sha256 {want['sha256']}"
        )
    if _file_name(sdist) != want["filename"]:
        bad.append(f"upstream sdist purl {sdist.get('purl')} does not name {want['filename']}")
    if record["build"]["mode"] == "precompiled":
        up = comps.get(UPSTREAM_WHEEL_REF, {})
        pinned = pins.get("upstream_wheel") or {}
        if _sha_of(up) != pinned.get("sha256"):
            bad.append(f"upstream wheel sha256 {_sha_of(up)}, bases.toml {pinned.get('sha256')}")
    listed = sorted(
        (c.get("name"), _sha_of(c), _prop(c, "change"), _prop(c, "upstream-pr"))
        for c in doc.get("components", [])
        if _prop(c, "role") == "patch"
    )
    expected = sorted(
        (p["file"], p["sha256"], p["change"], p.get("upstream_pr"))
        for p in record["series"]["patches"]
    )
    if listed != expected:
        diff = [f"{a[0]}" for a, b in zip(listed, expected, strict=False) if a != b]
        bad.append(
            f"patches differ from the wheel's record ({len(listed)} listed, "
            f"{len(expected)} recorded; first differing: {diff[:1] or 'count'})"
        )
    return bad
