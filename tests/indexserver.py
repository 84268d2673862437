"""A real package index on 127.0.0.1 for publish tests: pypiserver with a password file."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

USER = "ci"
PASSWORD = "ci-secret"


@dataclass(frozen=True)
class IndexServer:
    url: str  # upload URL; the simple index is url + "simple/"
    packages: Path

    @property
    def simple(self) -> str:
        return self.url + "simple/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def index_server(root: Path, hash_algo: str = "sha256") -> Iterator[IndexServer]:
    from passlib.apache import HtpasswdFile

    packages = root / "packages"
    packages.mkdir(parents=True)
    htpasswd = HtpasswdFile(str(root / "htpasswd"), new=True)
    htpasswd.set_password(USER, PASSWORD)
    htpasswd.save()
    port = free_port()
    log = open(root / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "pypiserver", "run", "-i", "127.0.0.1", "-p", str(port)]
        + ["-P", str(root / "htpasswd"), "-a", "update", "--hash-algo", hash_algo, str(packages)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(url + "simple/", timeout=2)
                break
            except requests.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "pypiserver did not start: " + (root / "server.log").read_text()
                    ) from None
                time.sleep(0.2)
        yield IndexServer(url, packages)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
