"""`vllm-fork pin`: read the index once and record sdist/wheel pins in bases.toml."""

from __future__ import annotations

import copy
from email.parser import HeaderParser
from typing import TYPE_CHECKING

from packaging.requirements import InvalidRequirement, Requirement

from vllm_fork.errors import NotOnIndexError
from vllm_fork.sources.fetch import PROJECT, Fetcher, Located
from vllm_fork.sources.pins import (
    Base,
    FilePin,
    Pins,
    check_version,
    pick_wheel,
    save_pins,
)

if TYPE_CHECKING:
    from vllm_fork.sources.workspace import Workspace


def _torch_pin(located: Located) -> str | None:
    """The exact torch version a wheel requires, from its PEP 658 metadata (if served)."""
    client = located.index._client
    if client is None or located.package.has_metadata is False:
        return None
    try:
        # Informational only (the wheel itself is pinned by sha256), so a metadata
        # file the index lists without a digest is still read.
        text = client.get_package_metadata(
            located.package, verify=False, timeout=located.index.pip.timeout
        )
    except Exception:  # optional information: never fail a pin over it
        return None
    for line in HeaderParser().parsestr(text).get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name == "torch" and req.marker is None:
            pinned = [s.version for s in req.specifier if s.operator == "=="]
            if pinned:
                return pinned[0]
    return None


def pin_versions(
    config: Workspace, fetcher: Fetcher, versions: list[str], *, supported: bool, default: bool
) -> Pins:
    """Pin ``versions`` from the index into bases.toml and return the new pins."""
    pins = copy.deepcopy(config.pins)  # edited, then written
    files = fetcher.project_files(PROJECT)
    by_name: dict[str, Located] = {}
    for located in files:
        by_name.setdefault(located.package.filename, located)
    for raw in versions:
        version = check_version(raw)
        sdist_name = f"{PROJECT}-{version}.tar.gz"
        sdist = by_name.get(sdist_name)
        if sdist is None:
            raise NotOnIndexError(f"{sdist_name} is not on the configured indexes")
        sdist_sha = sdist.package.digests.get("sha256")
        if not sdist_sha:
            raise NotOnIndexError(f"the index gives no sha256 for {sdist_name}")
        wheel_name = pick_wheel(list(by_name), version)
        wheel_pin = None
        torch = None
        if wheel_name is not None:
            wheel = by_name[wheel_name]
            wheel_sha = wheel.package.digests.get("sha256")
            if wheel_sha:
                wheel_pin = FilePin(wheel_name, wheel_sha)
                torch = _torch_pin(wheel)
        previous = pins.bases.get(version)
        pins.bases[version] = Base(
            version=version,
            sdist=FilePin(sdist_name, sdist_sha),
            wheel=wheel_pin,
            supported=supported or (previous.supported if previous else False),
            torch=torch or (previous.torch if previous else None),
            rocm=previous.rocm if previous else (),
        )
        if default:
            pins.default = version
    save_pins(config.bases_file, pins)
    return pins
