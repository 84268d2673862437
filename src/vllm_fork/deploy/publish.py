"""`vllm-fork publish WHEEL... --repository NAME|URL`: upload verified wheels to an index.

Each wheel must pass ``verify`` with its SBOM and provenance statement beside
it; a wheel that does not is refused before anything is uploaded. The upload
uses twine as a library, with twine's own settings: a repository NAME is read
from ~/.pypirc (or --config-file), credentials from TWINE_USERNAME /
TWINE_PASSWORD, ~/.pypirc or the keyring, as ``twine upload`` does.

Before uploading a file the index's simple page is read: the same file (same
sha256) already there is skipped (so a re-run publishes nothing twice); a
different file under the same name is an error.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import requests
from packaging.utils import parse_wheel_filename
from pypi_simple import NoSuchProjectError, PyPISimple

from vllm_fork.deploy.release_files import verify_release
from vllm_fork.errors import ForkError
from vllm_fork.hashing import sha256_file
from vllm_fork.series.forkversion import check_fork_version
from vllm_fork.sources.workspace import Workspace
from vllm_fork.wheel.provenance import from_wheel
from vllm_fork.wheel.wheelfile import Wheel

log = logging.getLogger(__name__)


class PublishError(ForkError):
    """A wheel was refused, or the index could not take it."""


@dataclass(frozen=True)
class Published:
    wheel: Path
    action: str  # "uploaded" | "already there"


def twine_settings(repository: str, config_file: str | None = None):  # -> twine Settings
    """twine's settings for ``repository`` (a ~/.pypirc name or an upload URL)."""
    # lazy: importing twine takes about half a second, and only publishing uses it
    from twine.settings import Settings

    parser = argparse.ArgumentParser(add_help=False)
    Settings.register_argparse_arguments(parser)
    args = ["--non-interactive", "--disable-progress-bar"]
    if "://" in repository:
        args += ["--repository-url", repository]
    else:
        args += ["--repository", repository]
    if config_file:
        args += ["--config-file", config_file]
    return Settings.from_argparse(parser.parse_args(args))


def simple_url(upload_url: str) -> str:
    """The simple index beside an upload URL (pypiserver, devpi, warehouse-like layouts)."""
    url = upload_url if upload_url.endswith("/") else upload_url + "/"
    if url.endswith("/legacy/"):
        return url[: -len("legacy/")] + "simple/"
    return url + "simple/"


def _host(url: str) -> str:
    parts = urlparse(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def _http_error(exc: requests.HTTPError, url: str, action: str) -> PublishError:
    status = exc.response.status_code if exc.response is not None else "?"
    if status in (401, 403):
        return PublishError(
            f"{_host(url)} refused the credentials (HTTP {status}) while {action}: check "
            "TWINE_USERNAME/TWINE_PASSWORD, ~/.pypirc or the keyring"
        )
    reason = exc.response.reason if exc.response is not None else str(exc)
    return PublishError(f"{_host(url)} answered HTTP {status} {reason} while {action}")


def index_files(
    session: requests.Session, index: str, project: str
) -> dict[str, tuple[str | None, str]]:
    """filename -> (sha256 or None when the index gives none, URL) of ``project`` on ``index``."""
    client = PyPISimple(endpoint=index, session=session)
    try:
        page = client.get_project_page(project)
    except NoSuchProjectError:
        return {}
    return {p.filename: ((p.digests or {}).get("sha256"), p.url) for p in page.packages}


def remote_sha256(session: requests.Session, url: str) -> str:
    """Download ``url`` and hash it (for an index that gives no sha256)."""
    h = hashlib.sha256()
    with session.get(url, stream=True, timeout=60) as resp:
        resp.raise_for_status()
        for block in resp.iter_content(1 << 20):
            h.update(block)
    return h.hexdigest()


def publish(
    config: Workspace,
    wheels: list[Path],
    repository: str,
    *,
    index_url: str | None = None,
    public_key: Path | None = None,
    config_file: str | None = None,
) -> list[Published]:
    # lazy: importing twine takes about half a second, and only publishing uses it
    from twine.exceptions import TwineException
    from twine.package import PackageFile

    for wheel in wheels:
        if not wheel.is_file():
            raise PublishError(f"{wheel}: no such file")
    # twine's settings and credentials first: a missing password is said at once,
    # not after the verification of every wheel
    try:
        settings = twine_settings(repository, config_file)
        upload_url = str(settings.repository_config["repository"])
        repo = settings.create_repository()
    except TwineException as exc:
        raise PublishError(f"twine: {exc}".splitlines()[0]) from None
    index = index_url or simple_url(upload_url)
    done: list[Published] = []
    try:
        for wheel in wheels:
            report = verify_release(
                config, wheel, public_key=public_key, require_release_files=True
            )
            if not report.passed:
                raise PublishError(
                    f"refusing {wheel.name}: it does not verify ({report.bad[0]}"
                    + (f"; +{len(report.bad) - 1} more" if len(report.bad) > 1 else "")
                    + "); run `vllm-fork verify` on it"
                )
        for wheel in wheels:
            digest = sha256_file(wheel)
            try:
                present = index_files(repo.session, index, "vllm")
            except requests.HTTPError as exc:
                raise _http_error(exc, index, "reading the index") from None
            if wheel.name in present:
                there, url = present[wheel.name]
                if there is None:
                    there = remote_sha256(repo.session, url)
                if there == digest:
                    log.info(f"{wheel.name} is already on {_host(index)} (same sha256)")
                    done.append(Published(wheel, "already there"))
                    continue
                raise PublishError(
                    f"{_host(index)} already has a different {wheel.name} (sha256 {there}, "
                    f"this file {digest}); an index never replaces a file: bump the series "
                    "revision for a new build"
                )
            package = PackageFile.from_filename(str(wheel), None)
            log.info(f"uploading {wheel.name} to {_host(upload_url)}")
            with contextlib.redirect_stdout(io.StringIO()) as said:  # twine prints progress
                resp = repo.upload(package)
            log.debug(said.getvalue().strip())
            if resp.is_redirect:
                raise PublishError(f"{_host(upload_url)} redirected the upload: wrong URL?")
            try:
                resp.raise_for_status()
            except requests.HTTPError as exc:
                if resp.status_code in (400, 409) and wheel.name in index_files(
                    repo.session, index, "vllm"
                ):
                    raise PublishError(
                        f"{_host(upload_url)} already has {wheel.name} (HTTP {resp.status_code})"
                    ) from None
                raise _http_error(exc, upload_url, f"uploading {wheel.name}") from None
            done.append(Published(wheel, "uploaded"))
    except requests.ConnectionError as exc:
        raise PublishError(
            f"cannot reach the index {_host(upload_url)}: {type(exc).__name__}"
        ) from None
    except requests.RequestException as exc:  # timeouts, too many redirects...
        raise PublishError(
            f"talking to the index {_host(upload_url)} failed: {type(exc).__name__}"
        ) from None
    except TwineException as exc:
        raise PublishError(f"twine: {exc}".splitlines()[0]) from None
    finally:
        repo.close()
    return done


def previous_published(
    version: str, index: str, *, session: requests.Session | None = None
) -> dict[str, Any] | None:
    """The provenance record of the newest fork version of the same base older than
    ``version`` on ``index`` (its wheel is downloaded), or None when there is none."""
    session = session or requests.Session()
    base, revision = check_fork_version(version)
    best: tuple[int, str, str] | None = None
    try:
        files = index_files(session, index, "vllm")
        for name, (_, url) in files.items():
            if not name.endswith(".whl"):
                continue
            try:
                b, r = check_fork_version(str(parse_wheel_filename(name)[1]))
            except (ForkError, ValueError):
                continue
            if b == base and r < revision and (best is None or r > best[0]):
                best = (r, name, url)
        if best is None:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / best[1]
            with session.get(best[2], stream=True, timeout=60) as resp, open(path, "wb") as fh:
                resp.raise_for_status()
                for block in resp.iter_content(1 << 20):
                    fh.write(block)
            with Wheel(path) as wheel:
                return from_wheel(wheel)
    except requests.ConnectionError as exc:
        raise PublishError(f"cannot reach the index {_host(index)}: {type(exc).__name__}") from None
    except requests.HTTPError as exc:
        raise _http_error(exc, index, "reading the previous fork version") from None
