"""bases.toml: the pinned upstream releases (sdist + x86_64 wheel, name and sha256)."""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from vllm_fork.atomic import write_text_atomic
from vllm_fork.errors import ConfigError, UnknownVersionError, UnsupportedBaseError, UsageError

log = logging.getLogger(__name__)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HEADER = (
    "# Pinned upstream vLLM releases. Written by `vllm-fork pin VERSION`; do not edit by hand.\n"
    "# sdist: the source release the series applies to; wheel: upstream's x86_64 build\n"
    "# of the same version (the binaries a precompiled build reuses); rocm.<variant>:\n"
    "# upstream's ROCm wheel of that version (`vllm-fork pin V --rocm-index URL`).\n\n"
)


@dataclass(frozen=True)
class FilePin:
    filename: str
    sha256: str


@dataclass(frozen=True)
class RocmPin:
    """Upstream's ROCm wheel of a base, for one ROCm variant (``rocm700``: its local
    version label, ROCm 7.0.0): the binaries a precompiled ``--device rocm`` build reuses."""

    variant: str
    filename: str
    sha256: str
    rocm: str  # the ROCm version the variant label stands for, e.g. 7.0.0
    python: str  # the wheel's Python tag, e.g. cp312
    index: str | None = None  # the index it was pinned from (no credentials); None: local

    @property
    def file(self) -> FilePin:
        return FilePin(self.filename, self.sha256)


@dataclass(frozen=True)
class Base:
    version: str
    sdist: FilePin
    wheel: FilePin | None = None
    supported: bool = False
    torch: str | None = None
    rocm: tuple[RocmPin, ...] = ()  # sorted by variant

    def rocm_pin(self, variant: str | None) -> RocmPin:
        """The ROCm pin of ``variant`` (None: the only one); UsageError naming what is pinned."""
        if not self.rocm:
            raise UsageError(
                f"bases.toml pins no upstream ROCm wheel for {self.version}; record one with "
                f"`vllm-fork pin {self.version} --rocm-index URL` (a PEP 503 index or mirror of "
                "upstream's ROCm wheels, or a local directory of wheels) or "
                f"`vllm-fork pin {self.version} --rocm-wheel FILE`"
            )
        names = ", ".join(p.variant for p in self.rocm)
        if variant is None:
            if len(self.rocm) > 1:
                raise UsageError(
                    f"bases.toml pins several ROCm variants of {self.version} ({names}): "
                    "pass --rocm-variant"
                )
            return self.rocm[0]
        for pin in self.rocm:
            if pin.variant == variant:
                return pin
        raise UsageError(
            f"bases.toml pins no ROCm variant {variant} of {self.version} (pinned: {names})"
        )


@dataclass
class Pins:
    default: str | None = None
    bases: dict[str, Base] = field(default_factory=dict)

    def versions(self) -> list[str]:
        return sorted(self.bases, key=Version)

    def get(self, version: str | None) -> Base:
        """The pinned base ``version`` (the default base when None)."""
        if version is None:
            if self.default is None:
                raise UsageError("bases.toml names no default base; pass --base VERSION")
            version = self.default
        try:
            return self.bases[version]
        except KeyError:
            known = ", ".join(self.versions()) or "none"
            raise UnknownVersionError(
                f"vLLM {version} is not pinned in bases.toml (known: {known})"
            ) from None


def _file_pin(data: Any, where: str) -> FilePin:
    if not isinstance(data, dict):
        raise ConfigError(f"bases.toml: {where} must be a table with filename and sha256")
    name, digest = data.get("filename"), data.get("sha256")
    if not isinstance(name, str) or not isinstance(digest, str):
        raise ConfigError(f"bases.toml: {where} needs filename and sha256 (strings)")
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ConfigError(f"bases.toml: {where}.sha256 is not a lowercase sha256 hex digest")
    if "/" in name or "\\" in name or name in {"", ".", ".."}:
        raise ConfigError(f"bases.toml: {where}.filename {name!r} is not a plain file name")
    return FilePin(name, digest)


ROCM_VARIANT_RE = re.compile(r"^rocm(?P<digits>[0-9]{3,})$")


def rocm_version_of(variant: str) -> str | None:
    """The ROCm version a variant label stands for: ``rocm700`` -> 7.0.0 (vLLM writes the
    first three digits of the ROCm version without dots); None when it is no such label."""
    m = ROCM_VARIANT_RE.match(variant)
    if not m:
        return None
    d = m.group("digits")
    return ".".join([d[0], d[1], d[2:]])


def _rocm_pins(data: Any, where: str) -> tuple[RocmPin, ...]:
    if not isinstance(data, dict):
        raise ConfigError(f"bases.toml: {where} must be a table of [{where}.<variant>] entries")
    pins = []
    for variant, entry in sorted(data.items()):
        at = f"{where}.{variant}"
        if rocm_version_of(variant) is None:
            raise ConfigError(f"bases.toml: {at}: {variant!r} is not a variant such as rocm700")
        file = _file_pin(entry, at)
        rocm, python, index = entry.get("rocm"), entry.get("python"), entry.get("index")
        if not isinstance(rocm, str) or not isinstance(python, str):
            raise ConfigError(f"bases.toml: {at} needs rocm and python (strings)")
        if index is not None and not isinstance(index, str):
            raise ConfigError(f"bases.toml: {at}.index must be a string")
        pins.append(RocmPin(variant, file.filename, file.sha256, rocm, python, index))
    return tuple(pins)


def load_pins(path: Path) -> Pins:
    """Read bases.toml; any malformed content is a ConfigError naming the entry."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return Pins()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    table = data.get("bases", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: 'bases' must be a table of [bases.\"VERSION\"] entries")
    bases: dict[str, Base] = {}
    for version, entry in table.items():
        where = f"bases.{version}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: {where} must be a table")
        try:
            Version(version)
        except InvalidVersion:
            raise ConfigError(f"{path}: {where}: {version!r} is not a version number") from None
        supported = entry.get("supported", False)
        torch = entry.get("torch")
        if not isinstance(supported, bool):
            raise ConfigError(f"{path}: {where}.supported must be true or false")
        if torch is not None and not isinstance(torch, str):
            raise ConfigError(f"{path}: {where}.torch must be a string")
        bases[version] = Base(
            version=version,
            sdist=_file_pin(entry.get("sdist"), f"{where}.sdist"),
            wheel=_file_pin(entry["wheel"], f"{where}.wheel") if "wheel" in entry else None,
            supported=supported,
            torch=torch,
            rocm=_rocm_pins(entry["rocm"], f"{where}.rocm") if "rocm" in entry else (),
        )
    default = data.get("default")
    if default is not None and not isinstance(default, str):
        raise ConfigError(f"{path}: default must be a version string")
    if default is not None and default not in bases:
        raise ConfigError(f"bases.toml: default base {default} is not pinned")
    return Pins(default=default, bases=bases)


def require_supported(config: Any, base: Base, *, allow: bool) -> None:
    """Refuse a base that bases.toml does not mark supported (its series, if any, is not
    maintained: the result would not be the hardened fork) unless ``allow``."""
    if base.supported:
        return
    why = f"vLLM {base.version} is not a supported base (bases.toml: supported = false)"
    if allow:
        log.warning("%s; using it anyway (--allow-unsupported)", why)
        return
    pins = config.pins
    supported = ", ".join(v for v in pins.versions() if pins.bases[v].supported) or "none"
    raise UnsupportedBaseError(
        f"{why}; supported bases: {supported} (pass --allow-unsupported to use it anyway)"
    )


def dump_pins(pins: Pins) -> str:
    """Stable TOML text: bases sorted by version, keys in a fixed order."""
    bases: dict[str, Any] = {}
    for version in pins.versions():
        base = pins.bases[version]
        entry: dict[str, Any] = {"supported": base.supported}
        if base.torch:
            entry["torch"] = base.torch
        entry["sdist"] = {"filename": base.sdist.filename, "sha256": base.sdist.sha256}
        if base.wheel:
            entry["wheel"] = {"filename": base.wheel.filename, "sha256": base.wheel.sha256}
        if base.rocm:
            entry["rocm"] = {
                pin.variant: {
                    "filename": pin.filename,
                    "sha256": pin.sha256,
                    "rocm": pin.rocm,
                    "python": pin.python,
                    **({"index": pin.index} if pin.index else {}),
                }
                for pin in sorted(base.rocm, key=lambda p: p.variant)
            }
        bases[version] = entry
    doc: dict[str, Any] = {}
    if pins.default:
        doc["default"] = pins.default
    doc["bases"] = bases
    return HEADER + tomli_w.dumps(doc)


def save_pins(path: Path, pins: Pins) -> None:
    write_text_atomic(path, dump_pins(pins))


def check_version(version: str) -> str:
    try:
        return str(Version(version))
    except InvalidVersion:
        raise UsageError(f"{version!r} is not a version number") from None


def pick_wheel(filenames: list[str], version: str) -> str | None:
    """The x86_64 manylinux wheel of ``version`` that pip would choose.

    When several builds exist (build tags such as ``-1``), pip prefers the
    highest build tag; an untagged wheel sorts lowest.
    """
    candidates: list[tuple[tuple[int, str] | tuple[()], str]] = []
    for name in filenames:
        try:
            _, wheel_version, build, tags = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        if wheel_version != Version(version):
            continue
        if any(t.platform.startswith("manylinux") and t.platform.endswith("_x86_64") for t in tags):
            candidates.append((build, name))
    if not candidates:
        return None
    return max(candidates)[1]
