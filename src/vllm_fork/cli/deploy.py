"""Command-line entries of ``publish`` and ``release-notes`` (added to cli.COMMANDS)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from vllm_fork.config import Config
from vllm_fork.errors import ExitCode, ForkError, UsageError
from vllm_fork.hashing import sha256_file


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


def _known_issues_of(config: Config, record: dict) -> dict | None:
    """The known-issue states of the wheel's base and series, as ``status`` computes
    them; None (the notes say "not judged") when the wheel was built from another
    series than ``series/<base>/`` holds now, or the base cannot be probed here."""
    from vllm_fork.reports.status import compute_status

    version = record["base"]["version"]
    try:
        series = config.series(version)  # type: ignore[attr-defined]
        now = {p.name: sha256_file(p) for p in series.patches}
        built = {p["file"]: p["sha256"] for p in record["series"]["patches"]}
        if any(now.get(name) != digest for name, digest in built.items()):
            return None
        report = compute_status(config, version)  # type: ignore[arg-type]
    except (ForkError, KeyError, TypeError, OSError) as exc:
        logging.getLogger(__name__).info("known issues not judged for the notes: %s", exc)
        return None
    return {s.issue: s.to_json() for s in report.known_issues}


def notes_run(args: argparse.Namespace, config: Config) -> int:
    from vllm_fork.build.provenance import from_wheel
    from vllm_fork.build.wheelfile import Wheel
    from vllm_fork.deploy import previous_record
    from vllm_fork.deploy.notes import make_notes
    from vllm_fork.hashing import sha256_file

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
            wheel_sha256=sha256_file(args.wheel),
            previous=previous,
            known_issues=_known_issues_of(config, record),
        ),
        end="",
    )
    return ExitCode.OK
