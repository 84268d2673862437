"""The tool's one message convention.

Every module logs through ``logging.getLogger(__name__)`` (all under the
``vllm_fork`` logger); nothing but a command's result goes to stdout. The CLI
calls :func:`setup` once: progress and notes go to stderr as
``vllm-fork: message``; ``-v`` adds debug messages (and the traceback of a
failure), ``-q`` keeps only warnings and errors.
"""

from __future__ import annotations

import logging
import sys

ROOT = "vllm_fork"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler that writes to ``sys.stderr`` as it is when a message is logged,
    not as it was at :func:`setup` (a caller that swaps stderr, as a test harness
    does, never leaves the tool writing to a closed stream)."""

    @property  # type: ignore[override]
    def stream(self):  # type: ignore[no-untyped-def]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # type: ignore[no-untyped-def]
        pass


def setup(verbosity: int = 0) -> None:
    """Route the tool's messages to stderr; ``verbosity`` is -1 (quiet), 0 or >= 1 (verbose)."""
    level = logging.DEBUG if verbosity > 0 else logging.WARNING if verbosity < 0 else logging.INFO
    logger = logging.getLogger(ROOT)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("vllm-fork: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
