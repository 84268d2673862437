"""Stage kernel design trials beside the fork's build (ROPE_EXTRA_VARIANTS).

After prepare.sh, each trial is the staged fork kernel file
(``DEST/src/fork-0.21.0/csrc``) with one design choice changed by a textual
edit that must match exactly once, written to ``DEST/src/<trial>/csrc``;
``--before TREE`` stages that tree's kernel file as ``fork-before`` (the
kernel before the change under test). Prints the ROPE_EXTRA_VARIANTS value.

Usage: trials.py DEST [--before TREE] [TRIAL ...]   (default: every trial)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

FORK = "fork-0.21.0"
FILES = ("pos_encoding_kernels.cu", "cuda_compat.h", "dispatch_utils.h")

# name: (what it tries, [(old, new), ...]) over the fork's kernel file (the
# final run's trials; the earlier runs' trial kernels are kept as diffs
# against it in results-h200/trials/).
TRIALS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "trial-neoxblock": (
        "NeoX with a cache wider than the query stays on the block kernel at "
        "every size (the kernel before)",
        [
            (
                "                flat = flat_threads > block_threads;",
                "                flat = false && flat_threads > block_threads;",
            )
        ],
    ),
}


def stage(dest: Path, name: str, edits: list[tuple[str, str]]) -> None:
    src = dest / "src" / FORK / "csrc"
    out = dest / "src" / name / "csrc"
    shutil.rmtree(out.parent, ignore_errors=True)
    out.mkdir(parents=True)
    for f in FILES:
        shutil.copy(src / f, out / f)
    kernel = out / FILES[0]
    text = kernel.read_text()
    for old, new in edits:
        count = text.count(old)
        if count != 1:
            raise SystemExit(f"trials: {name}: {old!r} matches {count} times, not once")
        text = text.replace(old, new)
    kernel.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path, help="what prepare.sh staged")
    ap.add_argument("--before", type=Path, help="a tree with the kernel before the change")
    ap.add_argument(
        "--file",
        action="append",
        default=[],
        help="NAME=KERNEL_FILE: stage that kernel file (with the fork's headers) as NAME",
    )
    ap.add_argument("trials", nargs="*", help=f"default: {' '.join(TRIALS)}")
    args = ap.parse_intermixed_args()
    names = args.trials or list(TRIALS)
    unknown = [n for n in names if n not in TRIALS]
    if unknown:
        print(f"trials: unknown {unknown}; known: {list(TRIALS)}", file=sys.stderr)
        return 2
    staged = []
    if args.before:
        out = args.dest / "src" / "fork-before" / "csrc"
        shutil.rmtree(out.parent, ignore_errors=True)
        out.mkdir(parents=True)
        for f in FILES:
            shutil.copy(args.before / "csrc" / f, out / f)
        staged.append("fork-before")
    for spec in args.file:
        name, _, path = spec.partition("=")
        stage(args.dest, name, [])
        shutil.copy(path, args.dest / "src" / name / "csrc" / FILES[0])
        staged.append(name)
    for name in names:
        stage(args.dest, name, TRIALS[name][1])
        staged.append(name)
    for name in names:
        print(f"# {name}: {TRIALS[name][0]}", file=sys.stderr)
    print(",".join(staged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
