"""Command-line entries of ``publish`` and ``release-notes`` (added to cli.COMMANDS)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_fork.errors import ExitCode
from vllm_fork.sources.workspace import Workspace


def publish_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("wheels", nargs="+", type=Path, metavar="WHEEL")
    p.add_argument(
        "-r",
        "--repository",
        required=True,
        metavar="NAME|URL",
        help="a repository of ~/.pypirc, or the index's upload URL (credentials: "
        "TWINE_USERNAME/TWINE_PASSWORD, ~/.pypirc or the keyring, as twine reads them)",
    )
    p.add_argument(
        "--index-url",
        metavar="URL",
        help="the index's simple URL, read to skip files already there "
        "(default: <upload URL>/simple/)",
    )
    p.add_argument(
        "--public-key",
        type=Path,
        metavar="PEM",
        help="Ed25519 public key checking signed provenance (also VLLM_FORK_PUBLIC_KEY)",
    )
    p.add_argument("--config-file", metavar="PYPIRC", help="twine's config (default ~/.pypirc)")


def publish_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.deploy.publish import publish

    done = publish(
        config,
        args.wheels,
        args.repository,
        index_url=args.index_url,
        public_key=args.public_key,
        config_file=args.config_file,
    )
    for item in done:
        print(f"{item.wheel.name}: {item.action}")
    return ExitCode.OK


def notes_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("wheel", type=Path, metavar="WHEEL")
    p.add_argument(
        "--previous",
        type=Path,
        metavar="WHEEL",
        help="the previous published fork wheel of the same base (default: the newest "
        "older one beside WHEEL)",
    )
    p.add_argument(
        "--index-url",
        metavar="URL",
        help="take the previous fork version of the same base from this simple index "
        "(the newest older one published there)",
    )


def notes_run(args: argparse.Namespace, config: Workspace) -> int:
    from vllm_fork.release.notes import wheel_notes

    text = wheel_notes(config, args.wheel, previous=args.previous, index_url=args.index_url)
    print(text, end="")
    return ExitCode.OK
