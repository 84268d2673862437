"""Scripts that run inside another Python environment (a build environment, a
smoke venv), where this package is not installed.

Each is run by path with ``python -I FILE`` (isolated: neither this directory
nor the user's site directory is on ``sys.path``), uses the standard library
only, and prints one JSON object on its last line of stdout.
"""

from pathlib import Path


def script(name: str) -> str:
    """The path of the script ``name`` (e.g. ``"pyinfo"``)."""
    return str(Path(__file__).with_name(f"{name}.py"))
