"""Makes and fills the virtual environments of the tool and its scripts: the
tool's ``.venv`` (scripts/venv.sh), the tree venvs (vllm_fork.testing.treevenv)
and the build environments (vllm_fork.wheel.env).

``uv`` does it where it is found (the one installed beside the running
interpreter, which scripts/venv.sh puts there at the pin of pyproject.toml,
then ``PATH``): it creates a venv in a fraction of a second and fills it from
its global cache with hard links, so a second venv of the same packages costs
seconds, not a reinstall. ``pip`` does it where uv is absent, or when
``VLLM_FORK_INSTALLER=pip``.

Both are given the same indexes, read once here (:func:`index_config`) from
what either would read by itself, so that the user's configuration holds
whichever runs:

- pip's configuration for ``pip install``: its files (``pip.conf``, ``PIP_CONFIG_FILE``)
  and the ``PIP_*`` variables (``index-url``, ``extra-index-url``, ``find-links``,
  ``no-index``, ``constraint``, ``trusted-host``, ``cert``, ``client-cert``,
  ``proxy``, ``timeout``);
- uv's variables: ``UV_DEFAULT_INDEX`` / ``UV_INDEX_URL`` (the index),
  ``UV_INDEX`` / ``UV_EXTRA_INDEX_URL`` (more indexes), ``UV_FIND_LINKS``,
  ``UV_NO_INDEX``, ``UV_CONSTRAINT``, ``UV_INSECURE_HOST``.

The index is the first of ``UV_DEFAULT_INDEX``, ``UV_INDEX_URL``,
``PIP_INDEX_URL`` and pip's files that is set (PyPI otherwise); the other
indexes, link directories, constraints and trusted hosts are all of them, in
that order. Like pip, every index is searched for the best version (uv's
``--index-strategy unsafe-best-match``). uv's own configuration files are not
read (``--no-config``): pip cannot read them, and what runs must not decide
where packages come from.

Run as a script (``python -m vllm_fork.sources.installer``, standard library
only) it makes and fills scripts/venv.sh's venv: see :func:`main`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_fork.errors import ForkError
from vllm_fork.sources.pipconf import PYPI_SIMPLE, merge, parse_config_list, pip_config_list

# "uv", "pip", or unset/"auto": uv where found, else pip
ENV_INSTALLER = "VLLM_FORK_INSTALLER"
CHOICES = ("auto", "uv", "pip")

# uv's variables that name where packages come from: read here and given to uv
# on its command line (and to pip the same way), never twice
_UV_INDEX_VARS = (
    "UV_DEFAULT_INDEX",
    "UV_INDEX_URL",
    "UV_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS",
    "UV_NO_INDEX",
    "UV_CONSTRAINT",
    "UV_INSECURE_HOST",
)


class InstallerError(ForkError):
    """uv or pip could not make or fill a venv (or uv was asked for and is absent)."""


@dataclass(frozen=True)
class IndexConfig:
    """Where packages come from, for pip and uv alike."""

    index_url: str = PYPI_SIMPLE
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    constraints: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    cert: str | None = None
    client_cert: str | None = None
    proxy: str | None = None
    timeout: float | None = None

    def pip_args(self) -> list[str]:
        """``pip install`` options that say all of it."""
        args = ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        if self.no_index:
            args.append("--no-index")
        for path in self.constraints:
            args += ["--constraint", path]
        for host in self.trusted_hosts:
            args += ["--trusted-host", host]
        if self.cert:
            args += ["--cert", self.cert]
        if self.client_cert:
            args += ["--client-cert", self.client_cert]
        if self.proxy:
            args += ["--proxy", self.proxy]
        if self.timeout:
            args += ["--timeout", f"{self.timeout:g}"]
        return args

    def uv_args(self) -> list[str]:
        """``uv pip install`` options that say all of it (certificates and the
        proxy go through :meth:`uv_env`)."""
        args = ["--no-config", "--index-strategy", "unsafe-best-match"]
        args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        if self.no_index:
            args.append("--no-index")
        for path in self.constraints:
            args += ["--constraint", path]
        for host in self.trusted_hosts:
            args += ["--allow-insecure-host", host]
        return args

    def uv_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment uv runs in: the index variables removed (the command
        line says them), pip's certificate, proxy and timeout in uv's terms."""
        env = {k: v for k, v in environ.items() if k not in _UV_INDEX_VARS}
        if self.cert:
            env["SSL_CERT_FILE"] = self.cert
        if self.client_cert:
            env["SSL_CLIENT_CERT"] = self.client_cert
        if self.proxy:
            for name in ("HTTP_PROXY", "HTTPS_PROXY"):
                env.setdefault(name, self.proxy)
        if self.timeout:
            env.setdefault("UV_HTTP_TIMEOUT", f"{self.timeout:g}")
        return env


def _split(value: str | None) -> tuple[str, ...]:
    return tuple((value or "").split())


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _dedup(items: Sequence[str], drop: Sequence[str] = ()) -> tuple[str, ...]:
    out: list[str] = []
    for item in items:
        if item and item not in out and item not in drop:
            out.append(item)
    return tuple(out)


def index_config(
    environ: Mapping[str, str] | None = None, pip_config_text: str | None = None
) -> IndexConfig:
    """The indexes both installers are given (module docstring: what is read
    and in which order). ``pip_config_text`` is ``pip config list``'s output
    (read from the running interpreter's pip when not given)."""
    environ = os.environ if environ is None else environ
    text = pip_config_list() if pip_config_text is None else pip_config_text
    sections = parse_config_list(text)
    pip = merge(sections, environ, command="install")
    values: dict[str, str] = {}
    for section in ("global", "install", ":env:"):
        values.update(sections.get(section, {}))
    for name, value in environ.items():
        if name.startswith("PIP_"):
            values[name[4:].lower().replace("_", "-")] = value
    index = (
        environ.get("UV_DEFAULT_INDEX", "").strip()
        or environ.get("UV_INDEX_URL", "").strip()
        or pip.index_url
    )
    # UV_INDEX entries may be named (name=url): the url is what counts here
    uv_extra = [
        u.partition("=")[2] if "=" in u.split("://")[0] else u
        for u in _split(environ.get("UV_INDEX"))
    ]
    extra = [*pip.extra_index_urls, *uv_extra, *_split(environ.get("UV_EXTRA_INDEX_URL"))]
    find_links = [*_split(values.get("find-links")), *_split(environ.get("UV_FIND_LINKS"))]
    constraints = [*_split(values.get("constraint")), *_split(environ.get("UV_CONSTRAINT"))]
    hosts = [*pip.trusted_hosts, *_split(environ.get("UV_INSECURE_HOST"))]
    timeout = values.get("timeout") or values.get("default-timeout")
    return IndexConfig(
        index_url=index,
        extra_index_urls=_dedup(extra, drop=[index]),
        find_links=_dedup(find_links),
        no_index=pip.no_index or _truthy(environ.get("UV_NO_INDEX")),
        constraints=_dedup(constraints),
        trusted_hosts=_dedup(hosts),
        cert=pip.cert,
        client_cert=pip.client_cert,
        proxy=pip.proxy,
        timeout=pip.timeout if timeout else None,
    )


def choice(environ: Mapping[str, str] | None = None) -> str:
    """``VLLM_FORK_INSTALLER``: auto (the default), uv or pip."""
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_INSTALLER, "").strip().lower() or "auto"
    if value not in CHOICES:
        raise InstallerError(
            f"{ENV_INSTALLER}={environ[ENV_INSTALLER]!r}: expected one of {', '.join(CHOICES)}"
        )
    return value


def find_uv(environ: Mapping[str, str] | None = None) -> str | None:
    """The uv to run: beside the running interpreter (the tool's venv has it), else
    on ``PATH``; None for pip (``VLLM_FORK_INSTALLER=pip``, or uv is absent)."""
    environ = os.environ if environ is None else environ
    want = choice(environ)
    if want == "pip":
        return None
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("uv", path=environ.get("PATH"))
    if found is None and want == "uv":
        raise InstallerError(f"{ENV_INSTALLER}=uv, but no uv is installed here (nor on PATH)")
    return found


@dataclass(frozen=True)
class Installer:
    """uv (``uv`` is its path) or pip (``uv`` is None), with the indexes to use."""

    uv: str | None
    indexes: IndexConfig

    @property
    def name(self) -> str:
        return "uv" if self.uv else "pip"

    def create_command(self, where: Path, python: str, *, pip: bool = False) -> list[str]:
        """The command that makes the venv ``where`` for ``python`` (``pip``: with pip in it)."""
        if self.uv:
            cmd = [self.uv, "venv", "--quiet", "--no-config", "--python", python]
            return [*cmd, *(["--seed"] if pip else []), str(where)]
        return [python, "-m", "venv", *([] if pip else ["--without-pip"]), str(where)]

    def install_command(self, python: Path | str, args: Sequence[str]) -> list[str]:
        """The command that installs ``args`` (requirements and options) into the venv
        of ``python``."""
        if self.uv:
            return [
                self.uv,
                "pip",
                "install",
                "--quiet",
                "--python",
                str(python),
                *self.indexes.uv_args(),
                *args,
            ]
        return [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            *self.indexes.pip_args(),
            *args,
        ]

    def env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        environ = os.environ if environ is None else environ
        return self.indexes.uv_env(environ) if self.uv else dict(environ)

    def create(self, where: Path, python: str = sys.executable, *, pip: bool = False) -> None:
        _run(self.create_command(where, python, pip=pip), self.env(), f"create the venv {where}")

    def install(self, python: Path | str, args: Sequence[str], **kwargs: object) -> str:
        """Install; returns the installer's output. Fails with the last lines of it."""
        return _run(
            self.install_command(python, args),
            self.env(),
            f"{self.name} install {' '.join(args)}",
            **kwargs,
        )


def _run(cmd: list[str], env: Mapping[str, str], what: str, **kwargs: object) -> str:
    try:
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(env),
            **kwargs,  # type: ignore[call-overload]
        )
    except OSError as exc:
        raise InstallerError(f"cannot {what}: {exc}") from None
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-15:])
        raise InstallerError(f"{what} failed:\n{tail}")
    return proc.stdout


def installer(environ: Mapping[str, str] | None = None) -> Installer:
    """The installer for this process: uv where found, pip otherwise."""
    return Installer(find_uv(environ), index_config(environ))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vllm_fork.sources.installer VENV [PIP-INSTALL-ARGS...]``: make
    VENV for this interpreter (with pip in it) if it is not there, then install the
    arguments into it, with uv when ``UV`` names one (scripts/venv.sh installs it
    first), else pip. One line on stderr and exit 1 when it cannot."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m vllm_fork.sources.installer VENV [ARGS...]", file=sys.stderr)
        return 2
    where, rest = Path(args[0]), args[1:]
    try:
        uv = os.environ.get("UV") or None
        if choice() == "pip":
            uv = None
        tool = Installer(uv, index_config())
        python = where / "bin" / "python"
        if not python.exists():
            tool.create(where, sys.executable, pip=True)
        if rest:
            tool.install(python, rest)
    except InstallerError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        print("\n".join(str(exc).splitlines()[1:]), file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
