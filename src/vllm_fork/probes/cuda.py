"""Careful text helpers for CUDA/C++ sources (comments and strings aware)."""

from __future__ import annotations

import re
from dataclasses import dataclass


def strip_comments(text: str) -> str:
    """Remove // and /* */ comments; string and char literals are kept as is."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_strings(text: str) -> str:
    """Empty the string literals of comment-free ``text`` (keeps the quotes)."""
    return re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', text)


def matching(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index of the bracket closing the one at ``start`` (-1 if unbalanced)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i
    return -1


@dataclass(frozen=True)
class CFunction:
    name: str
    params: list[str]  # one declaration per parameter, whitespace-normalised
    body: str
    template_types: list[str]  # typename/class template parameters, if any
    is_kernel: bool


def split_top(text: str, sep: str = ",") -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [" ".join(p.split()) for p in parts]


_DEF = re.compile(r"\b(?P<name>[A-Za-z_]\w*)\s*\(")
_KEYWORDS = {"if", "for", "while", "switch", "return", "catch", "sizeof", "decltype"}


def functions(text: str) -> list[CFunction]:
    """Function definitions (with a body) in comment-stripped ``text``."""
    found = []
    for m in _DEF.finditer(text):
        if m.group("name") in _KEYWORDS:
            continue
        close = matching(text, m.end() - 1, "(", ")")
        if close < 0:
            continue
        k = close + 1
        while k < len(text) and text[k] in " \t\r\n":
            k += 1
        # allow trailing qualifiers such as const / noexcept before the body
        q = re.match(r"(?:const|noexcept|override)\b\s*", text[k:])
        if q:
            k += q.end()
        if k >= len(text) or text[k] != "{":
            continue
        head_start = max(text.rfind(";", 0, m.start()), text.rfind("}", 0, m.start())) + 1
        head = text[head_start : m.start()]
        if not re.search(r"\b(void|int|bool|auto|float|double|[\w:]+)\s*[*&]?\s*$", head):
            continue
        end = matching(text, k, "{", "}")
        if end < 0:
            continue
        ttypes: list[str] = []
        tmatch = re.search(r"template\s*<([^{};]*?)>", head)
        if tmatch:
            for p in split_top(tmatch.group(1)):
                pm = re.match(r"(?:typename|class)\s+(\w+)", p)
                if pm:
                    ttypes.append(pm.group(1))
        found.append(
            CFunction(
                name=m.group("name"),
                params=split_top(text[m.end() : close]),
                body=text[k + 1 : end],
                template_types=ttypes,
                is_kernel="__global__" in head,
            )
        )
    return found


def param_name(decl: str) -> str:
    m = re.search(r"(\w+)\s*(?:=.*)?$", decl)
    return m.group(1) if m else ""


def pointee_type(decl: str) -> str | None:
    """``const cache_t* __restrict__ x`` -> ``cache_t``."""
    m = re.match(r"(?:const\s+)?([\w:]+)\s*(?:const\s*)?\*", decl)
    return m.group(1) if m else None


def macro_calls(text: str, needle: str = "DISPATCH") -> list[tuple[str, str]]:
    """``(macro name, first argument)`` for each call of a macro whose name holds ``needle``."""
    out = []
    for m in re.finditer(r"\b(\w*" + needle + r"\w*)\s*\(", text):
        close = matching(text, m.end() - 1, "(", ")")
        if close < 0:
            continue
        args = split_top(text[m.end() : close])
        out.append((m.group(1), args[0] if args else ""))
    return out


def defined_macros(text: str) -> set[str]:
    return set(re.findall(r"^\s*#\s*define\s+(\w+)", text, flags=re.M))
