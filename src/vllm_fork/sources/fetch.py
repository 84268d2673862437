"""Find pinned files on the configured indexes, download them and verify sha256.

Files land in ``<cache>/dist/<filename>`` only after their hash matched the
pin: the transfer goes to a temporary file in the cache, which is renamed
atomically on success and removed on any failure.
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse
from urllib.request import url2pathname

import requests
from packaging.utils import canonicalize_name
from pypi_simple import DistributionPackage, NoSuchProjectError, ProjectPage, PyPISimple
from pypi_simple.progress import ProgressTracker, null_progress_tracker, tqdm_progress_factory

from vllm_fork import __version__, faults
from vllm_fork.atomic import place_file
from vllm_fork.config import ENV_CACHE
from vllm_fork.errors import (
    CacheError,
    ForkError,
    HashMismatchError,
    NetworkError,
    NotOnIndexError,
    OfflineError,
    fs_fault,
    is_fs_fault,
)
from vllm_fork.hashing import sha256_file
from vllm_fork.lock import cache_lock, owned_tempfile
from vllm_fork.sources.pins import FilePin
from vllm_fork.sources.pipconf import PipConfig, load_pip_config

if TYPE_CHECKING:
    from vllm_fork.sources.workspace import Workspace


log = logging.getLogger(__name__)

PROJECT = "vllm"
_CHUNK = 1 << 20


def _redact(url: str) -> str:
    """An index URL without credentials, for messages."""
    parts = urlparse(url)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return parts._replace(netloc=netloc).geturl()
    return url


class Index:
    """One package index (http(s) via pypi-simple, or a local ``file://`` tree)."""

    def __init__(self, url: str, pip: PipConfig) -> None:
        self.url = url if url.endswith("/") else url + "/"
        self.pip = pip
        parts = urlparse(self.url)
        self.is_local = parts.scheme == "file"
        self._client: PyPISimple | None = None
        if not self.is_local:
            session = requests.Session()
            session.headers["User-Agent"] = f"vllm-fork/{__version__}"
            host = parts.hostname or ""
            trusted = host in pip.trusted_hosts or parts.netloc in pip.trusted_hosts
            session.verify = False if trusted else (pip.cert or True)
            if pip.client_cert:
                session.cert = pip.client_cert
            if pip.proxy:
                session.proxies.update({"http": pip.proxy, "https": pip.proxy})
            self._client = PyPISimple(endpoint=self.url, session=session)

    @property
    def display(self) -> str:
        return _redact(self.url)

    def packages(self, project: str) -> list[DistributionPackage] | None:
        """The project's files on this index, or None when the index lacks the project."""
        if self._client is None:
            return self._local_packages(project)
        try:
            page = self._client.get_project_page(project, timeout=self.pip.timeout)
        except NoSuchProjectError:
            return None
        except (requests.RequestException, ValueError) as exc:
            raise NetworkError(f"cannot read index {self.display}: {exc}") from exc
        return list(page.packages)

    def _local_packages(self, project: str) -> list[DistributionPackage] | None:
        base = Path(url2pathname(urlparse(self.url).path))
        page_file = base / canonicalize_name(project) / "index.html"
        if not page_file.is_file():
            return None
        page_url = page_file.parent.as_uri() + "/"
        page = ProjectPage.from_html(project, page_file.read_bytes(), base_url=page_url)
        return list(page.packages)

    def download(
        self,
        pkg: DistributionPackage,
        target: Path,
        progress: Callable[[int | None], ProgressTracker],
    ) -> None:
        """Write the file's bytes to ``target`` (no verification here)."""
        if urlparse(pkg.url).scheme == "file":
            source = Path(url2pathname(urlparse(pkg.url).path))
            try:
                with open(source, "rb") as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, _CHUNK)
            except OSError as exc:
                if is_fs_fault(exc):
                    raise fs_fault(exc, target, f"copying {pkg.filename}") from exc
                raise NetworkError(f"cannot read {source}: {exc}") from exc
            return
        assert self._client is not None
        try:
            self._client.download_package(
                pkg,
                target,
                verify=False,
                keep_on_error=True,
                progress=progress,
                timeout=self.pip.timeout,
            )
        except (requests.RequestException, OSError) as exc:
            if is_fs_fault(exc) and not isinstance(exc, requests.RequestException):
                raise fs_fault(exc, target, f"downloading {pkg.filename}") from exc
            raise NetworkError(
                f"download of {pkg.filename} from {self.display} failed: {exc}"
            ) from exc


@dataclass(frozen=True)
class Located:
    index: Index
    package: DistributionPackage


class Fetcher:
    """Download and verify pinned files into the cache."""

    def __init__(self, config: Workspace, pip: PipConfig | None = None) -> None:
        self.config = config
        self._pip = pip
        self._pages: dict[str, list[Located]] = {}
        self._errors: list[str] = []

    @property
    def pip(self) -> PipConfig:
        if self._pip is None:
            self._pip = load_pip_config()
        return self._pip

    def cached_path(self, pin: FilePin) -> Path:
        return self.config.dist_dir / pin.filename

    def project_files(self, project: str = PROJECT) -> list[Located]:
        """Every file of ``project`` on the configured indexes, index order kept."""
        if self.config.offline:
            raise OfflineError("offline mode is on: the package index cannot be read")
        if project in self._pages:
            return self._pages[project]
        found: list[Located] = []
        errors: list[str] = []
        indexes = self.pip.indexes
        if not indexes:
            raise NotOnIndexError("the pip configuration disables all indexes (no-index)")
        for url in indexes:
            index = Index(url, self.pip)
            try:
                packages = index.packages(project)
            except NetworkError as exc:
                errors.append(str(exc))
                continue
            found.extend(Located(index, pkg) for pkg in packages or ())
        if not found and errors:
            raise NetworkError("; ".join(errors))
        self._pages[project] = found
        self._errors = errors
        return found

    def locate(self, filename: str, project: str = PROJECT) -> Located:
        files = self.project_files(project)
        for located in files:
            if located.package.filename == filename:
                return located
        searched = ", ".join(Index(u, self.pip).display for u in self.pip.indexes)
        failed = f"; unreachable: {'; '.join(self._errors)}" if self._errors else ""
        raise NotOnIndexError(
            f"{filename} is not on any configured index (searched: {searched}){failed}"
        )

    def locate_in(self, filename: str, url: str, project: str = PROJECT) -> Located:
        """``filename`` on the one index ``url`` (not the pip configuration's)."""
        if self.config.offline:
            raise OfflineError("offline mode is on: the package index cannot be read")
        index = Index(url, self.pip)
        for pkg in index.packages(project) or ():
            if pkg.filename == filename:
                return Located(index, pkg)
        raise NotOnIndexError(f"{filename} is not on the index {index.display}")

    def ensure(self, pin: FilePin, project: str = PROJECT, *, index: str | None = None) -> Path:
        """Return the cached, verified file for ``pin``, downloading it if needed
        (from the index ``index`` when given, else from the configured indexes)."""
        with cache_lock(self.config.cache_dir):
            path = self.cached_path(pin)
            if path.is_file():
                actual = sha256_file(path)
                if actual == pin.sha256:
                    self._remember(path, actual)
                    return path
                reason = self._stale_reason(pin, path, actual)
                path.unlink()
                if self.config.offline:
                    raise OfflineError(
                        f"{reason}; it was removed, and offline mode is on, so it cannot be "
                        "downloaded again (run `vllm-fork fetch` with network access)"
                    )
                log.warning("%s; downloading the pinned file", reason)
            elif self.config.offline:
                raise OfflineError(
                    f"{pin.filename} is not in the cache ({self.config.dist_dir}) and offline "
                    "mode is on (--offline or VLLM_FORK_OFFLINE=1); run `vllm-fork fetch` "
                    "with network access first"
                )
            if index is not None:
                located = self.locate_in(pin.filename, index, project)
            else:
                located = self.locate(pin.filename, project)
            self._download_verified(located, pin, path)
            return path

    def _record(self, path: Path) -> Path:
        return self.config.cache.download_record(path.name)

    def _remember(self, path: Path, digest: str) -> None:
        """Record the sha256 a cached file had when verified (to tell a changed pin from
        damage later); a cache that cannot be written just goes without."""
        record = self._record(path)
        try:
            if not record.is_file() or record.read_text().strip() != digest:
                record.parent.mkdir(parents=True, exist_ok=True)
                record.write_text(digest + "\n")
        except OSError:
            pass

    def _stale_reason(self, pin: FilePin, path: Path, actual: str) -> str:
        """Why a cached file does not match its pin: the pin changed, or the file is corrupt."""
        record = self._record(path)
        stored = record.read_text().strip() if record.is_file() else None
        if stored == actual:
            return (
                f"the pin of {pin.filename} changed: the cached file has sha256 {actual}, "
                f"bases.toml now pins {pin.sha256}"
            )
        return f"cached {pin.filename} is corrupt: sha256 {actual}, pinned {pin.sha256}" + (
            f" (it was stored as {stored})" if stored and stored != pin.sha256 else ""
        )

    def _download_verified(self, located: Located, pin: FilePin, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = owned_tempfile(self.config.tmp_dir, pin.filename)
        except OSError as exc:
            raise CacheError(
                f"cannot write to the cache {self.config.cache_dir}: {exc.strerror or exc} "
                f"(fix its permissions or set {ENV_CACHE} to a writable directory)"
            ) from exc
        size = getattr(located.package, "size", None)
        log.info(
            "downloading %s%s from %s (not in the cache: pinned in bases.toml)",
            pin.filename,
            f" ({size / 1e6:.1f} MB)" if isinstance(size, int) else "",
            located.index.display,
        )
        try:
            located.index.download(located.package, tmp, self._progress(pin.filename))
            faults.point("fetch.download")
            actual = sha256_file(tmp)
            if actual != pin.sha256:
                raise HashMismatchError(
                    f"sha256 mismatch for {pin.filename} from {located.index.display}: "
                    f"expected {pin.sha256}, got {actual}; the download was discarded"
                )
            place_file(tmp, path, shared=True)
            faults.point("fetch.store")
            self._remember(path, actual)
        except ForkError:
            raise
        except OSError as exc:
            raise CacheError(
                f"cannot store {pin.filename} in the cache {self.config.cache_dir}: "
                f"{exc.strerror or exc}"
            ) from exc
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _progress(filename: str) -> Callable[[int | None], ProgressTracker]:
        if sys.stderr.isatty():
            return tqdm_progress_factory(
                desc=filename, unit="B", unit_scale=True, unit_divisor=1024, leave=False
            )
        return null_progress_tracker()
