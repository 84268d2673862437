"""Small helpers to look at Python sources through ``ast`` (never importing them)."""

from __future__ import annotations

import ast
import functools
import textwrap
from collections.abc import Iterator

FuncDef = ast.FunctionDef | ast.AsyncFunctionDef


def parse(text: str | None) -> ast.Module | None:
    """Parse ``text``; None when missing or not valid Python. Results are shared
    between probes (treat them as read-only)."""
    if text is None:
        return None
    return _parse(text)


@functools.lru_cache(maxsize=16)
def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def functions(tree: ast.AST) -> Iterator[FuncDef]:
    """Every function or method defined anywhere below ``tree``."""
    return iter(_functions(tree))


@functools.lru_cache(maxsize=256)
def _functions(tree: ast.AST) -> tuple[FuncDef, ...]:
    # Probes ask for the functions of the same parsed module many times (call
    # graphs): walk each tree once. AST nodes hash by identity and are never
    # changed after parsing.
    return tuple(
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    )


def find_function(tree: ast.AST, name: str) -> FuncDef | None:
    for fn in functions(tree):
        if fn.name == name:
            return fn
    return None


def classes_with_method(tree: ast.AST, name: str) -> list[ast.ClassDef]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
            isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) and b.name == name
            for b in node.body
        ):
            found.append(node)
    return found


def method(cls: ast.ClassDef, name: str) -> FuncDef | None:
    for b in cls.body:
        if isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef) and b.name == name:
            return b
    return None


def call_name(call: ast.Call) -> str:
    """Last component of the called object: ``a.b.c(...)`` -> ``c``."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def calls(tree: ast.AST, name: str | None = None) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and (name is None or call_name(n) == name)
    ]


def identifiers(tree: ast.AST) -> set[str]:
    """Names, attribute names and short string constants mentioned below ``tree``."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value) < 80:
            out.add(n.value)
    return out


def mentions(tree: ast.AST, word: str) -> bool:
    """Whether some identifier below ``tree`` contains ``word`` (case-insensitive)."""
    w = word.lower()
    return any(w in i.lower() for i in identifiers(tree))


def parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    out: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            out[child] = node
    return out


def guards(node: ast.AST, parent_of: dict[ast.AST, ast.AST]) -> list[ast.expr]:
    """Tests of the ``if`` statements / expressions whose body holds ``node``
    (innermost first). A node in an ``else`` branch gets the negated test."""
    out: list[ast.expr] = []
    child = node
    cur = parent_of.get(node)
    while cur is not None:
        if isinstance(cur, ast.If | ast.IfExp):
            branch: list[ast.AST] = [*cur.orelse] if isinstance(cur, ast.If) else [cur.orelse]
            in_else = child in branch
            if child is not cur.test:
                out.append(ast.UnaryOp(ast.Not(), cur.test) if in_else else cur.test)
        child, cur = cur, parent_of.get(cur)
    return out


def is_dtype_attr(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "dtype"


def env_names(tree: ast.AST) -> set[str]:
    """Environment variable names read below ``tree``: ``envs.NAME``,
    ``os.environ[...]``, ``os.environ.get(...)``, ``os.getenv(...)`` and
    ``VLLM_*`` string constants."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "envs"
            and n.attr.isupper()
        ):
            out.add(n.attr)
        elif (
            isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and n.value.startswith("VLLM_")
            and n.value.replace("_", "").isalnum()
        ):
            out.add(n.value)
    return out


def reachable(module: ast.AST, roots: list[FuncDef], depth: int = 3) -> list[FuncDef]:
    """``roots`` plus the functions/methods of ``module`` they call by name,
    followed ``depth`` levels deep."""
    by_name: dict[str, list[FuncDef]] = {}
    for fn in functions(module):
        by_name.setdefault(fn.name, []).append(fn)
    seen: list[FuncDef] = list(roots)
    frontier = list(roots)
    for _ in range(depth):
        nxt = []
        for fn in frontier:
            for c in calls(fn):
                for target in by_name.get(call_name(c), []):
                    if target not in seen:
                        seen.append(target)
                        nxt.append(target)
        frontier = nxt
    return seen


def local_assignments(fn: FuncDef) -> dict[str, list[ast.expr]]:
    """Values assigned to plain local names in ``fn`` (all assignments)."""
    out: dict[str, list[ast.expr]] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                for name in _target_names(t):
                    out.setdefault(name, []).append(n.value)
        elif isinstance(n, ast.AnnAssign | ast.AugAssign) and n.value is not None:
            for name in _target_names(n.target):
                out.setdefault(name, []).append(n.value)
        elif isinstance(n, ast.NamedExpr):
            out.setdefault(n.target.id, []).append(n.value)
        elif isinstance(n, ast.withitem) and n.optional_vars is not None:
            for name in _target_names(n.optional_vars):
                out.setdefault(name, []).append(n.context_expr)
    return out


def _target_names(t: ast.AST) -> list[str]:
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, ast.Tuple | ast.List):
        return [x for e in t.elts for x in _target_names(e)]
    return []


SCALAR_CALLS = {"int", "float", "len", "max", "min", "item", "sum", "numel", "size", "bool"}


def dataflow_ids(
    expr: ast.AST,
    assigns: dict[str, list[ast.expr]],
    *,
    skip_scalars: bool = True,
    stop_calls: frozenset[str] = frozenset(),
    _seen: set[str] | None = None,
) -> set[str]:
    """Identifiers ``expr`` depends on, following local assignments.
    With ``skip_scalars``, parts that reduce an array to one number (indexing with
    a scalar, ``int()``, ``.item()``, ``len()``...) contribute nothing; so do
    the arguments of calls named in ``stop_calls``."""
    seen = set() if _seen is None else _seen
    out: set[str] = set()

    def visit(n: ast.AST) -> None:
        if skip_scalars:
            if isinstance(n, ast.Subscript) and not isinstance(n.slice, ast.Slice | ast.Tuple):
                return
            if isinstance(n, ast.Call) and call_name(n) in SCALAR_CALLS:
                return
        if isinstance(n, ast.Call) and call_name(n) in stop_calls:
            return
        if isinstance(n, ast.Name):
            out.add(n.id)
            if n.id in assigns and n.id not in seen:
                seen.add(n.id)
                for v in assigns[n.id]:
                    out.update(
                        dataflow_ids(
                            v, assigns, skip_scalars=skip_scalars, stop_calls=stop_calls, _seen=seen
                        )
                    )
            return
        if isinstance(n, ast.Attribute):
            out.add(n.attr)
        for c in ast.iter_child_nodes(n):
            visit(c)

    visit(expr)
    return out


def self_attr(node: ast.AST) -> str | None:
    """``self.X`` -> ``"X"``."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


# --- code units: what the upstream watch compares between releases ----------------

# The unit of a non-Python file (or of lines outside every function): the whole file.
WHOLE_FILE = "*"


def unit_spans(text: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, last line) of the units of ``text``, innermost
    first: every outermost function (top-level functions and the methods of
    (nested) classes, named ``Class.method``; a function inside a function
    belongs to its outer one), then every class (``Class``: its own statements,
    such as fields, without its methods). Decorators count as lines of their
    function or class. Lines outside all of them belong to :data:`MODULE`.
    Empty when ``text`` is not valid Python."""
    module = parse(text)
    if module is None:
        return []
    functions_out: list[tuple[str, int, int]] = []
    classes_out: list[tuple[str, int, int]] = []

    def first_line(node: ast.stmt) -> int:
        decorators = getattr(node, "decorator_list", [])
        return min([node.lineno, *(d.lineno for d in decorators)])

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                name = f"{prefix}{node.name}"
                classes_out.append((name, first_line(node), node.end_lineno or node.lineno))
                walk(node.body, f"{name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                end = node.end_lineno or node.lineno
                functions_out.append((f"{prefix}{node.name}", first_line(node), end))
            elif isinstance(node, ast.If | ast.Try):
                # functions defined under a module-level ``if``/``try`` (version guards)
                for block in (node.body, node.orelse, getattr(node, "finalbody", [])):
                    walk(block, prefix)

    walk(module.body, "")
    # innermost classes first: a nested class's lines belong to it
    classes_out.sort(key=lambda span: span[2] - span[1])
    return functions_out + classes_out


# The unit of the lines of a Python file outside every function and class
# (imports, constants).
MODULE = "<module>"


def unit_at(spans: list[tuple[str, int, int]], line: int) -> str:
    """The unit of :func:`unit_spans` that holds ``line`` (:data:`MODULE` when none)."""
    for name, first, last in spans:
        if first <= line <= last:
            return name
    return MODULE


class _Hollow(ast.NodeTransformer):
    """Leaves out what belongs to other units: functions, and nested classes."""

    def __init__(self, keep: ast.AST) -> None:
        self.keep = keep

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST | None:
        return node if node is self.keep else None

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST | None:
        return node if node is self.keep else None

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST | None:
        if node is not self.keep and not isinstance(self.keep, ast.Module):
            return None
        self.generic_visit(node)
        if not node.body:
            node.body = [ast.Pass()]
        return node


def unit_digests(text: str) -> dict[str, str]:
    """Each unit of ``text`` (and :data:`MODULE`) -> its code with comments and
    layout left out (an ``ast`` dump; a class without its methods, the module
    without its functions and classes), so that only a change of code counts.
    Units that share a name (overloads, version branches) are joined in order."""
    module = parse(text)
    if module is None:
        return {}
    lines = text.splitlines()
    out: dict[str, list[str]] = {}
    for name, first, last in unit_spans(text):
        source = textwrap.dedent("\n".join(lines[first - 1 : last]))
        try:
            node = ast.parse(source)
        except SyntaxError:
            out.setdefault(name, []).append(source)
            continue
        body = node.body[0] if node.body else node
        if isinstance(body, ast.ClassDef):
            body = _Hollow(body).visit(body)
            body = ast.Module(body=[body], type_ignores=[])
        out.setdefault(name, []).append(ast.dump(body, include_attributes=False))
    top = ast.parse(text)
    top.body = [
        stmt
        for stmt in top.body
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    out[MODULE] = [ast.dump(top, include_attributes=False)]
    return {name: "\n".join(parts) for name, parts in out.items()}
