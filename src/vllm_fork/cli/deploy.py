"""Command-line entries of ``publish`` and ``release-notes`` (added to cli.COMMANDS)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_fork.config import Config


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


def publish_run(args: argparse.Namespace, config: Config) -> int:
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
    return 0


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


def notes_run(args: argparse.Namespace, config: Config) -> int:
    from vllm_fork.build.wheelfile import Wheel
    from vllm_fork.deploy import file_sha256, previous_record
    from vllm_fork.deploy.notes import make_notes
    from vllm_fork.errors import ForkError, UsageError
    from vllm_fork.provenance import from_wheel

    def record_of(path: Path) -> dict:
        try:
            with Wheel(path) as w:
                return from_wheel(w)
        except ForkError as exc:
            raise UsageError(f"{path}: not a fork wheel with a provenance record ({exc})") from None

    record = record_of(args.wheel)
    if args.previous:
        previous = record_of(args.previous)
    elif args.index_url:
        from vllm_fork.deploy.publish import previous_published

        previous = previous_published(record["version"], args.index_url)
    else:
        previous = previous_record(args.wheel)
    print(
        make_notes(
            record,
            wheel_name=args.wheel.name,
            wheel_sha256=file_sha256(args.wheel),
            previous=previous,
        ),
        end="",
    )
    return 0
