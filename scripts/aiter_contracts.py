#!/usr/bin/env python3
"""Record the contracts the ROCm simulation's fakes must keep, as JSON data.

Reads (never imports, never runs on a GPU):
- the fake packages of the simulation, ``sim/vllm_rocm_sim/site/{aiter,amdsmi}``,
  to learn which names to look up (every public function, class method and
  module attribute the fakes define);
- a git clone of ROCm/aiter (``--aiter-git``), at every AITER tag a pinned
  vLLM base builds; a name of the fake ``aiter`` is resolved in the real
  package by following its imports (``from .ops.topk import *`` ...) with
  ``ast``, the way ``import aiter`` would bind it;
- the ``amdsmi`` wheel from PyPI (``--amdsmi-wheel``), its
  ``amdsmi/__init__.py`` and the modules it re-exports;
- the pinned vLLM trees (tags ``upstream/<V>`` of the tool's upstream git),
  for the AITER tag each pins and the ``amdsmi`` names it imports.

Writes, under ``sim/contracts`` (sorted keys, stable order, re-runnable):
- ``bases.json``: base -> pinned AITER tag, the tag whose contract stands
  for it (the pinned one, or the newest older tag the clone has, marked as a
  substitute), and the amdsmi names vLLM imports;
- ``aiter/<tag>.json``: for each name, the defining file and its signature
  (parameter names, kinds, defaults and annotations as source text, return
  annotation) or ``missing``; module attributes as their assigned names;
- ``amdsmi/<version>.json``: the same for the names the wheel exports.

``golden`` (a second command, needs torch) runs AITER's own PyTorch reference
implementations (``*_torch`` in aiter/ops) on fixed inputs: the function's
source is cut out with ``ast`` and executed in a namespace holding only torch
and a dtype table, then inputs and outputs go to ``golden/<tag>.json``.

Only signatures, names and numbers are written: no AITER or amdsmi source.

    python scripts/aiter_contracts.py extract --aiter-git DIR --amdsmi-wheel WHL
    <python with torch> scripts/aiter_contracts.py golden --aiter-git DIR --tag TAG...
    python scripts/aiter_contracts.py table
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("aiter_contracts")

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / "sim" / "vllm_rocm_sim" / "site"
CONTRACTS = REPO / "sim" / "contracts"
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "sim"))

from vllm_rocm_sim.contracts import _src, signature  # noqa: E402  (one signature format)

from vllm_fork.cache import CacheLayout, default_cache_dir  # noqa: E402
from vllm_fork.facts.names import tag_for  # noqa: E402

Reader = Callable[[str], str | None]

# ----------------------------------------------------------------------------
# signatures


def _body(nodes: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, looking into try/if blocks (conditional imports)."""
    for node in nodes:
        if isinstance(node, ast.Try):
            yield from _body(node.body)
            for h in node.handlers:
                yield from _body(h.body)
            yield from _body(node.orelse)
        elif isinstance(node, ast.If):
            yield from _body(node.body)
            yield from _body(node.orelse)
        else:
            yield node


def _bound(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def describe(node: ast.stmt, file: str) -> dict[str, Any]:
    """What a definition is: a function's signature, a class's public methods'
    signatures and attributes, or a module-level assignment's source kind."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return {"kind": "function", "file": file, **signature(node)}
    if isinstance(node, ast.ClassDef):
        methods = {
            b.name: signature(b)
            for b in node.body
            if isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef)
            and (not b.name.startswith("_") or b.name == "__init__")
        }
        attrs = sorted(
            n for b in node.body for n in _bound(b) if not isinstance(b, ast.FunctionDef)
        )
        return {
            "kind": "class",
            "file": file,
            "bases": [_src(b) for b in node.bases],
            "attributes": attrs,
            "methods": dict(sorted(methods.items())),
        }
    value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
    # An assignment from a call (a pybind enum, a type() of a compiled object) is
    # defined by compiled code: only its existence can be recorded.
    return {"kind": "assigned", "file": file, "from_call": isinstance(value, ast.Call)}


# ----------------------------------------------------------------------------
# resolving a name of a package the way ``import`` binds it


class Package:
    """A Python package read from text files (a git tag or a wheel)."""

    def __init__(self, read: Reader) -> None:
        self.read = read
        self._parsed: dict[str, tuple[str, ast.Module] | None] = {}

    def module(self, dotted: str) -> tuple[str, ast.Module] | None:
        if dotted not in self._parsed:
            self._parsed[dotted] = None
            base = dotted.replace(".", "/")
            for path in (f"{base}.py", f"{base}/__init__.py"):
                text = self.read(path)
                if text is not None:
                    try:
                        self._parsed[dotted] = (path, ast.parse(text))
                    except SyntaxError:
                        log.warning("%s: not valid Python; skipped", path)
                    break
            parent, _, last = dotted.rpartition(".")
            if self._parsed[dotted] is None and parent:
                # ``from .utility import dtypes as dtypes``: a module bound by name
                bound = self.resolve(parent, last)
                if bound is not None and bound["kind"] == "module":
                    text = self.read(bound["file"])
                    if text is not None:
                        self._parsed[dotted] = (bound["file"], ast.parse(text))
        return self._parsed[dotted]

    def resolve(self, dotted: str, name: str, depth: int = 0) -> dict[str, Any] | None:
        """Where ``from <dotted> import <name>`` gets its object, described."""
        found = self.module(dotted)
        if found is None or depth > 12:
            return None
        path, tree = found
        hit: dict[str, Any] | None = None
        for node in _body(tree.body):
            if name in _bound(node):
                hit = describe(node, path)  # the last binding wins, as at run time
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(dotted, path, node)
                for alias in node.names:
                    if alias.name == "*" and not name.startswith("_"):
                        sub = self.resolve(target, name, depth + 1)
                        hit = sub or hit
                    elif (alias.asname or alias.name) == name:
                        sub = self.resolve(target, alias.name, depth + 1)
                        if sub is None and self.module(f"{target}.{alias.name}"):
                            sub = {
                                "kind": "module",
                                "file": self.module(f"{target}.{alias.name}")[0],
                            }
                        hit = sub or hit
        if hit is None and self.module(f"{dotted}.{name}") is not None:
            hit = {"kind": "module", "file": self.module(f"{dotted}.{name}")[0]}
        return hit


def _absolute(dotted: str, path: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = dotted.split(".")
    if not path.endswith("__init__.py"):
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


# ----------------------------------------------------------------------------
# the names the fakes define


def fake_names(package: str) -> dict[str, list[str]]:
    """Public names each module of the fake ``package`` defines at top level,
    plus ``Class.method`` for the public methods of its classes."""
    root = SITE / package
    names: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(SITE).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        if any(p.startswith("_") for p in parts):
            continue
        module = ".".join(parts)
        tree = ast.parse(path.read_text())
        found = []
        for node in _body(tree.body):
            for n in _bound(node):
                if not n.startswith("_") and n != "log":
                    found.append(n)
        if found:
            names[module] = sorted(set(found))
    return names


# ----------------------------------------------------------------------------
# sources


def git_reader(git_dir: Path, rev: str) -> Reader:
    def read(path: str) -> str | None:
        out = subprocess.run(
            ["git", "--git-dir", str(git_dir), "show", f"{rev}:{path}"],
            capture_output=True,
        )
        return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else None

    return read


def wheel_reader(wheel: Path) -> Reader:
    zf = zipfile.ZipFile(wheel)
    members = set(zf.namelist())

    def read(path: str) -> str | None:
        return zf.read(path).decode("utf-8", "replace") if path in members else None

    return read


def git_tags(git_dir: Path) -> list[str]:
    out = subprocess.run(
        ["git", "--git-dir", str(git_dir), "tag", "--list", "v*"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def tag_key(tag: str) -> tuple:
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(tag.lstrip("v")))
    except InvalidVersion:
        return (1, tag)


# ----------------------------------------------------------------------------
# extract


def contract(pkg: Package, names: dict[str, list[str]]) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    for module, module_names in sorted(names.items()):
        for name in module_names:
            found = pkg.resolve(module, name)
            entries[f"{module}.{name}"] = found if found is not None else {"kind": "missing"}
    return entries


def base_pins(upstream_git: Path, versions: list[str]) -> dict[str, dict[str, Any]]:
    from vllm_fork.probes.rocm_pins import aiter_pin, amdsmi_imports
    from vllm_fork.sourcetree import GitTree

    pins = {}
    for v in versions:
        tree = GitTree(upstream_git, tag_for(v))
        pins[v] = {"aiter": aiter_pin(tree), "amdsmi_imports": sorted(amdsmi_imports(tree))}
    return pins


def closest(tag: str, available: list[str]) -> str | None:
    """``tag`` if available, else the newest available tag not newer than it."""
    if tag in available:
        return tag
    older = [t for t in available if tag_key(t)[0] == 0 and tag_key(t) <= tag_key(tag)]
    return max(older, key=tag_key) if older else None


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    log.info("wrote %s", path.relative_to(REPO))


def cmd_extract(args: argparse.Namespace) -> int:
    from vllm_fork.sources.pins import load_pins

    versions = sorted(load_pins(REPO / "bases.toml").versions(), key=tag_key)
    pins = base_pins(args.upstream_git, versions)
    available = git_tags(args.aiter_git)
    aiter_names = fake_names("aiter")
    tags: dict[str, str] = {}
    for v, pin in pins.items():
        if pin["aiter"] is None:
            raise SystemExit(f"error: base {v} pins no AITER tag in its Dockerfile.rocm_base")
        use = closest(pin["aiter"], available)
        if use is None:
            raise SystemExit(f"error: no AITER tag at or before {pin['aiter']} in {args.aiter_git}")
        pin["contract"] = use
        if use != pin["aiter"]:
            pin["substitute"] = (
                f"{pin['aiter']} is not in the AITER clone; {use} is the newest older tag"
            )
            log.warning("base %s: %s", v, pin["substitute"])
        tags[use] = pin["aiter"]
    write_json(CONTRACTS / "bases.json", pins)
    for tag in sorted(tags, key=tag_key):
        commit = subprocess.run(
            ["git", "--git-dir", str(args.aiter_git), "rev-parse", f"{tag}^{{commit}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        pkg = Package(git_reader(args.aiter_git, tag))
        data = {"tag": tag, "commit": commit, "names": contract(pkg, aiter_names)}
        write_json(CONTRACTS / "aiter" / f"{tag}.json", data)
    wheel = Package(wheel_reader(args.amdsmi_wheel))
    version = args.amdsmi_wheel.name.split("-")[1]
    exported = sorted(
        n for n in _module_names(wheel, "amdsmi") if not n.startswith("_") or n == "__version__"
    )
    wanted = sorted(
        {n for p in pins.values() for n in p["amdsmi_imports"]}
        | set(fake_names("amdsmi").get("amdsmi", []))
    )
    data = {
        "version": version,
        "wheel": args.amdsmi_wheel.name,
        "exported": exported,
        "names": contract(wheel, {"amdsmi": wanted}),
    }
    write_json(CONTRACTS / "amdsmi" / f"{version}.json", data)
    return 0


def _module_names(pkg: Package, dotted: str) -> list[str]:
    found = pkg.module(dotted)
    if found is None:
        return []
    return sorted({n for node in _body(found[1].body) for n in _names_bound_by(node)})


def _names_bound_by(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [a.asname or a.name for a in node.names if a.name != "*"]
    return _bound(node)


# ----------------------------------------------------------------------------
# golden outputs of AITER's PyTorch references


def reference(read: Reader, path: str, name: str) -> Callable[..., Any]:
    """Cut the function ``name`` out of ``path`` and define it in a namespace
    with torch and AITER's dtype names (``dtypes.fp32``...) only."""
    import types

    import torch

    text = read(path)
    if text is None:
        raise SystemExit(f"error: {path} is not in this AITER tag")
    tree = ast.parse(text)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        raise SystemExit(f"error: {path} defines no {name}")
    fn.decorator_list = []
    dtypes = types.SimpleNamespace(
        fp32=torch.float32, i32=torch.int32, bf16=torch.bfloat16, fp16=torch.float16
    )
    namespace: dict[str, Any] = {"torch": torch, "dtypes": dtypes, "Optional": Any, "Tuple": tuple}
    exec(
        compile(ast.Module(body=[fn], type_ignores=[]), f"<aiter {path}:{name}>", "exec"), namespace
    )
    return namespace[name]


def golden_cases() -> list[dict[str, Any]]:
    """Fixed inputs: ties, negative biases, masked groups, odd sizes."""
    import torch

    def logits(tokens: int, experts: int, seed: int) -> list[list[float]]:
        g = torch.Generator().manual_seed(seed)
        # Values on a 1/8 grid: exact in every float type, ties happen.
        return (torch.randint(-24, 25, (tokens, experts), generator=g) / 8).tolist()

    cases: list[dict[str, Any]] = []
    # biased_grouped_topk_torch(gating_output, correction_bias, topk, renormalize,
    #                           num_expert_group, topk_group)
    for tokens, experts, groups, topk_group, topk, bias, renorm, why in (
        (3, 16, 4, 2, 4, "positive", True, "DeepSeek-like shape, small"),
        (5, 16, 4, 2, 4, "negative", True, "negative biases"),
        (4, 24, 8, 3, 5, "mixed", False, "odd top-k, 3 experts per group, no renorm"),
        (1, 8, 2, 1, 2, "zero", True, "one token, half the groups masked"),
        (7, 12, 3, 1, 3, "negative", True, "odd tokens, 2 of 3 groups masked, bias < -1"),
    ):
        g = torch.Generator().manual_seed(experts * 31 + tokens)
        b = {
            "positive": torch.randint(0, 9, (experts,), generator=g) / 16,
            "negative": -torch.randint(0, 9, (experts,), generator=g) / 16
            - (1.25 if "< -1" in why else 0.0),
            "mixed": torch.randint(-8, 9, (experts,), generator=g) / 16,
            "zero": torch.zeros(experts),
        }[bias]
        cases.append(
            {
                "function": "biased_grouped_topk_torch",
                "why": why,
                "args": {
                    "gating_output": logits(tokens, experts, tokens * 7 + experts),
                    "correction_bias": b.tolist(),
                    "topk": topk,
                    "renormalize": renorm,
                    "num_expert_group": groups,
                    "topk_group": topk_group,
                },
            }
        )
    # ties: every score equal within a token
    cases.append(
        {
            "function": "biased_grouped_topk_torch",
            "why": "all scores and biases tied",
            "args": {
                "gating_output": [[0.5] * 8, [0.0] * 8],
                "correction_bias": [0.0] * 8,
                "topk": 2,
                "renormalize": True,
                "num_expert_group": 4,
                "topk_group": 2,
            },
        }
    )
    for tokens, experts, groups, topk_group, topk, func, renorm, why in (
        (3, 16, 4, 2, 4, "softmax", True, "softmax scoring"),
        (5, 16, 4, 2, 3, "sigmoid", False, "sigmoid scoring, odd top-k"),
        (4, 24, 8, 3, 5, "softmax", False, "3 experts per group, masked groups"),
        (1, 6, 3, 1, 2, "sigmoid", True, "one token, 2 of 3 groups masked"),
    ):
        cases.append(
            {
                "function": "grouped_topk_torch",
                "why": why,
                "args": {
                    "gating_output": logits(tokens, experts, tokens * 11 + experts),
                    "topk": topk,
                    "renormalize": renorm,
                    "num_expert_group": groups,
                    "topk_group": topk_group,
                    "scoring_func": func,
                },
            }
        )
    cases.append(
        {
            "function": "grouped_topk_torch",
            "why": "all logits tied",
            "args": {
                "gating_output": [[1.0] * 8],
                "topk": 3,
                "renormalize": True,
                "num_expert_group": 2,
                "topk_group": 1,
                "scoring_func": "softmax",
            },
        }
    )
    return cases


REFERENCES = {
    "biased_grouped_topk_torch": "aiter/ops/topk.py",
    "grouped_topk_torch": "aiter/ops/topk.py",
}


def _outside_groups(case: dict[str, Any], ids: list[list[int]]) -> bool:
    """Whether the reference picked an expert outside the groups it chose: it
    masks unchosen experts with 0.0, so a negative choice score loses to them."""
    import torch

    a = case["args"]
    x = torch.tensor(a["gating_output"], dtype=torch.float32)
    scores = (
        x.sigmoid()
        if "correction_bias" in a or a.get("scoring_func") == "sigmoid"
        else x.softmax(-1)
    )
    per_group = x.shape[1] // a["num_expert_group"]
    if "correction_bias" in a:
        choice = scores + torch.tensor(a["correction_bias"], dtype=torch.float32)
        group = choice.view(x.shape[0], a["num_expert_group"], -1).topk(2, dim=-1)[0].sum(-1)
    else:
        group = scores.view(x.shape[0], a["num_expert_group"], -1).amax(-1)
    chosen = group.topk(a["topk_group"], dim=-1).indices.tolist()
    return any(
        i // per_group not in set(c) for row, c in zip(ids, chosen, strict=True) for i in row
    )


def run_golden(read: Reader) -> list[dict[str, Any]]:
    import torch

    fns = {name: reference(read, path, name) for name, path in REFERENCES.items()}
    out = []
    for case in golden_cases():
        a = dict(case["args"])
        a["gating_output"] = torch.tensor(a["gating_output"], dtype=torch.float32)
        if "correction_bias" in a:
            a["correction_bias"] = torch.tensor(a["correction_bias"], dtype=torch.float32)
        weights, ids = fns[case["function"]](**a)
        # The references call topk(sorted=False): the order of the k picks is
        # unspecified, so each row is stored sorted by expert id.
        order = ids.long().argsort(dim=-1)
        ids_sorted = ids.gather(1, order).tolist()
        entry = {
            **case,
            "expected": {
                "topk_ids": ids_sorted,
                "topk_weights": [[float(x) for x in row] for row in weights.gather(1, order)],
            },
        }
        if _outside_groups(case, ids_sorted):
            entry["not_comparable"] = (
                "the reference masks unchosen groups with 0.0, so with negative biased "
                "scores it picks experts outside the chosen groups; the kernels and the "
                "fake keep the group limit"
            )
        out.append(entry)
    return out


def cmd_golden(args: argparse.Namespace) -> int:
    """One file per distinct result: tags whose references agree share it."""
    import torch

    groups: list[tuple[list[str], list[dict[str, Any]]]] = []
    for tag in sorted(args.tag, key=tag_key):
        cases = run_golden(git_reader(args.aiter_git, tag))
        for tags, known in groups:
            if known == cases:
                tags.append(tag)
                break
        else:
            groups.append(([tag], cases))
    for tags, cases in groups:
        data = {
            "tags": tags,
            "torch": torch.__version__.split("+")[0],
            "references": REFERENCES,
            "cases": cases,
        }
        write_json(CONTRACTS / "golden" / f"{tags[0]}.json", data)
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    """Print the name x tag table of sim/CONTRACTS.md and any failure."""
    from vllm_rocm_sim.contracts import check_bases, table

    rows, failures = check_bases()
    print(table(rows))
    for failure in failures:
        log.error("%s", failure)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract", help="signatures per pinned AITER tag, amdsmi, base pins")
    e.add_argument("--aiter-git", type=Path, required=True, help="git dir of a ROCm/aiter clone")
    e.add_argument("--amdsmi-wheel", type=Path, required=True)
    e.add_argument(
        "--upstream-git",
        type=Path,
        default=CacheLayout(default_cache_dir()).upstream_git,
        help="the tool's upstream git (default: the cache's, $VLLM_FORK_CACHE_DIR honoured; "
        "run `vllm-fork fetch --base V` for every base first)",
    )
    e.set_defaults(run=cmd_extract)
    g = sub.add_parser("golden", help="outputs of AITER's torch references at one tag")
    g.add_argument("--aiter-git", type=Path, required=True)
    g.add_argument(
        "--tag", required=True, nargs="+", help="AITER tags (default: all in bases.json)"
    )
    g.set_defaults(run=cmd_golden)
    t = sub.add_parser("table", help="the comparison table of the fakes (for sim/CONTRACTS.md)")
    t.set_defaults(run=cmd_table)
    args = p.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
