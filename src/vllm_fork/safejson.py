"""JSON from files nobody vouches for (a wheel's provenance record, an SBOM beside it).

:func:`loads` bounds what a hostile document can cost: its size is capped
before it is parsed, its text must be UTF-8, and its nesting depth is capped
(a document nested deeper than the parser's recursion limit is refused, never
a ``RecursionError``; one nested deeper than :data:`MAX_DEPTH` is refused
after parsing, so that no later reader recurses into it). Every refusal is a
:class:`JSONLimitError`, a ``ValueError`` with a one-line message.
"""

from __future__ import annotations

import json
from typing import Any

MAX_BYTES = 16 << 20  # a provenance record is a few KiB, an SBOM a few hundred
MAX_DEPTH = 64  # the tool's documents nest 8 deep at most


class JSONLimitError(ValueError):
    """A document that is too large, not UTF-8, nested too deep or not JSON."""


def _too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` deep (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def loads(data: bytes | str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``data`` as JSON within the limits; :class:`JSONLimitError` otherwise."""
    size = len(data)  # characters of a str: a lower bound of its UTF-8 size
    if size > max_bytes:
        raise JSONLimitError(f"{size} bytes, more than the {max_bytes} a document may have")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JSONLimitError(
                f"not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
            ) from None
    else:
        text = data
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONLimitError(f"nested more than {max_depth} deep") from None
    except ValueError as exc:
        raise JSONLimitError(f"not JSON: {str(exc).splitlines()[0]}") from None
    if _too_deep(value, max_depth):
        raise JSONLimitError(f"nested more than {max_depth} deep")
    return value
