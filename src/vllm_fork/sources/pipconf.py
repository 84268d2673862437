"""The user's pip configuration (indexes, certificates, proxy), read the way pip reads it.

``python -m pip config list`` merges the global, user and site files and the
``PIP_*`` environment variables; its output is parsed here. The tool mirrors
``pip download``, so it uses pip's precedence for that command: the
``[global]`` section, then ``[download]``, then the environment. Other
commands' sections (``[install]``, ...) are never read, as pip does not. The environment
is also read directly so that the tool works where pip itself is missing.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

PYPI_SIMPLE = "https://pypi.org/simple/"

# The pip command whose configuration the tool mirrors.
COMMAND = "download"
# Lowest to highest precedence, as pip applies them for ``pip download``.
# ``:env:`` is how ``pip config list`` shows PIP_* variables.
SECTION_ORDER = ("global", COMMAND, ":env:")

_KEYS = (
    "index-url",
    "extra-index-url",
    "cert",
    "client-cert",
    "trusted-host",
    "proxy",
    "timeout",
    "default-timeout",
    "no-index",
)


@dataclass(frozen=True)
class PipConfig:
    index_url: str = PYPI_SIMPLE
    extra_index_urls: tuple[str, ...] = ()
    cert: str | None = None
    client_cert: str | None = None
    trusted_hosts: tuple[str, ...] = ()
    proxy: str | None = None
    timeout: float = 60.0
    no_index: bool = False

    @property
    def indexes(self) -> tuple[str, ...]:
        """Indexes in the order they are searched (index-url first), no duplicates."""
        if self.no_index:
            return ()
        seen: list[str] = []
        for url in (self.index_url, *self.extra_index_urls):
            if url not in seen:
                seen.append(url)
        return tuple(seen)


def parse_config_list(text: str) -> dict[str, dict[str, str]]:
    """Parse ``pip config list`` output (``section.key='value'`` lines) by section."""
    sections: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or "=" not in line:
            continue
        name, _, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not dot:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        sections.setdefault(section, {})[key] = str(value)
    return sections


def _env_section(environ: Mapping[str, str]) -> dict[str, str]:
    """``PIP_FOO_BAR`` variables as pip option names (``foo-bar``)."""
    return {
        name[4:].lower().replace("_", "-"): value
        for name, value in environ.items()
        if name.startswith("PIP_") and name[4:].lower().replace("_", "-") in _KEYS
    }


def _truthy(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


def merge(
    sections: Mapping[str, Mapping[str, str]],
    environ: Mapping[str, str],
    command: str = COMMAND,
) -> PipConfig:
    """Combine config sections and the environment into a :class:`PipConfig`, as
    pip does for ``command`` (``download``; ``install`` for the installers)."""
    values: dict[str, str] = {}
    for section in ("global", command, ":env:"):
        values.update(sections.get(section, {}))
    values.update(_env_section(environ))

    def listed(key: str) -> tuple[str, ...]:
        return tuple(values.get(key, "").split())

    timeout = values.get("timeout") or values.get("default-timeout")
    try:
        timeout_s = float(timeout) if timeout else 60.0
    except ValueError:
        timeout_s = 60.0
    return PipConfig(
        index_url=values.get("index-url", "").strip() or PYPI_SIMPLE,
        extra_index_urls=listed("extra-index-url"),
        cert=values.get("cert") or None,
        client_cert=values.get("client-cert") or None,
        trusted_hosts=listed("trusted-host"),
        proxy=values.get("proxy") or None,
        timeout=timeout_s,
        no_index=_truthy(values.get("no-index", "")),
    )


def pip_config_list(python: str = sys.executable) -> str:
    """The output of ``python -m pip config list``; empty when pip is unavailable."""
    try:
        proc = subprocess.run(
            [python, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


def load_pip_config(environ: Mapping[str, str] | None = None) -> PipConfig:
    environ = os.environ if environ is None else environ
    return merge(parse_config_list(pip_config_list()), environ)
