# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Check the fake ``aiter`` and ``amdsmi`` against the recorded real contracts.

The contracts (``sim/contracts``, written by ``scripts/aiter_contracts.py``)
hold the real signatures per AITER tag and for the amdsmi wheel, and which
tag each vLLM base pins. Here the fakes are read with ``ast`` (this module
imports neither torch nor the fakes, so the tool's own tests can run it) and
compared:

- a fake function or method of a name the real package has at a base's tag
  must take the real parameters in the real order, with the real kinds and
  defaults; it may add trailing parameters, all defaulted, that a newer tag
  has (``newer``); a function the real one declares ``-> None`` (it writes
  its outputs in place) must be ``-> None`` in the fake too;
- a fake module attribute must exist in the real package at that tag;
- every amdsmi name a base's vLLM imports must be defined by the fake and by
  the real wheel, with the real signature.

Known, explained differences are listed in ``sim/contracts/deviations.json``
(``"<name>@<tag>": "<why>"``); any other difference, and any listed one that
no longer occurs, is reported with the name and the tag.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIM = Path(__file__).resolve().parent.parent
SITE = SIM / "vllm_rocm_sim" / "site"
CONTRACTS = SIM / "contracts"

MATCHED = "matched"
NEWER = "newer"  # the fake also takes trailing, defaulted parameters of a later tag
ABSENT = "absent"  # the real package has no such name at this tag
DEVIATION = "deviation"  # differs, explained in deviations.json
MISMATCH = "mismatch"


# ----------------------------------------------------------------------------
# signatures (also used by scripts/aiter_contracts.py to write the contracts)


def _src(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def _param(arg: ast.arg, kind: str, default: ast.expr | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": arg.arg, "kind": kind}
    if default is not None:
        entry["default"] = _src(default)
    if arg.annotation is not None:
        entry["annotation"] = _src(arg.annotation)
    return entry


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any]:
    """Parameters in order (name, kind, default, annotation) and return annotation."""
    a = fn.args
    params: list[dict[str, Any]] = []
    positional = a.posonlyargs + a.args
    missing = len(positional) - len(a.defaults)
    pos_defaults: list[ast.expr | None] = [None] * missing + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, pos_defaults, strict=True)):
        kind = "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword"
        params.append(_param(arg, kind, default))
    if a.vararg:
        params.append(_param(a.vararg, "var_positional", None))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(_param(arg, "keyword_only", default))
    if a.kwarg:
        params.append(_param(a.kwarg, "var_keyword", None))
    return {"params": params, "returns": _src(fn.returns)}


def render(params: list[dict[str, Any]]) -> str:
    out = []
    for p in params:
        star = {"var_positional": "*", "var_keyword": "**"}.get(p["kind"], "")
        text = star + p["name"] + (f"={p['default']}" if "default" in p else "")
        if p["kind"] == "keyword_only":
            text = "kw:" + text
        out.append(text)
    return "(" + ", ".join(out) + ")"


def compare(fake: dict[str, Any], real: dict[str, Any]) -> tuple[str, str]:
    """(MATCHED | NEWER | MISMATCH, detail) for one function's signatures."""

    def key(p: dict[str, Any]) -> tuple:
        return (p["name"], p["kind"], p.get("default"))

    fk = [key(p) for p in fake["params"]]
    rk = [key(p) for p in real["params"]]
    detail = f"fake {render(fake['params'])} vs real {render(real['params'])}"
    if real.get("returns") == "None" and fake.get("returns") != "None":
        return MISMATCH, f"real returns None (writes in place), fake -> {fake.get('returns')}"
    if fk == rk:
        return MATCHED, ""
    extra = fake["params"][len(rk) :]
    if fk[: len(rk)] == rk and all(
        "default" in p or p["kind"] in ("var_positional", "var_keyword") for p in extra
    ):
        return NEWER, "fake also takes " + render(extra)
    return MISMATCH, detail


# ----------------------------------------------------------------------------
# the fakes, read with ast


def _body(nodes: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in nodes:
        if isinstance(node, ast.Try):
            out += _body(node.body)
            for h in node.handlers:
                out += _body(h.body)
        elif isinstance(node, ast.If):
            out += _body(node.body) + _body(node.orelse)
        else:
            out.append(node)
    return out


@dataclass
class FakeModule:
    functions: dict[str, dict[str, Any]] = field(default_factory=dict)
    classes: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    attributes: set[str] = field(default_factory=set)

    @property
    def names(self) -> set[str]:
        return set(self.functions) | set(self.classes) | self.attributes


def read_fake(package: str, site: Path = SITE) -> dict[str, FakeModule]:
    """Public top-level definitions of every module of a fake package."""
    modules: dict[str, FakeModule] = {}
    for path in sorted((site / package).rglob("*.py")):
        parts = list(path.relative_to(site).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if any(p.startswith("_") for p in parts):
            continue
        mod = FakeModule()
        for node in _body(ast.parse(path.read_text()).body):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if not node.name.startswith("_"):
                    mod.functions[node.name] = signature(node)
            elif isinstance(node, ast.ClassDef):
                if not node.name.startswith("_"):
                    mod.classes[node.name] = {
                        b.name: signature(b)
                        for b in node.body
                        if isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef)
                        and (not b.name.startswith("_") or b.name == "__init__")
                    }
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                mod.attributes |= {
                    t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("_")
                }
        modules[".".join(parts)] = mod
    return modules


# ----------------------------------------------------------------------------
# the contracts


def load(name: str, root: Path = CONTRACTS) -> Any:
    return json.loads((root / name).read_text())


@dataclass(frozen=True)
class Row:
    """One comparison: a fake name at one real tag (or amdsmi version)."""

    name: str
    tag: str
    state: str
    detail: str = ""


def aiter_rows(tag: str, contract: dict[str, Any], fake: dict[str, FakeModule]) -> list[Row]:
    rows: list[Row] = []
    real = contract["names"]
    for module, mod in sorted(fake.items()):
        for fname, sig in sorted(mod.functions.items()):
            name = f"{module}.{fname}"
            rows.append(_row(name, tag, real.get(name), sig))
        for cname, methods in sorted(mod.classes.items()):
            name = f"{module}.{cname}"
            entry = real.get(name, {"kind": "missing"})
            if entry["kind"] != "class":
                rows.append(_row(name, tag, entry, None))
                continue
            for mname, sig in sorted(methods.items()):
                rows.append(_row(f"{name}.{mname}", tag, entry["methods"].get(mname), sig))
        for attr in sorted(mod.attributes):
            name = f"{module}.{attr}"
            entry = real.get(name, {"kind": "missing"})
            state = ABSENT if entry["kind"] == "missing" else MATCHED
            rows.append(
                Row(name, tag, state, "" if state == MATCHED else "not in the real package")
            )
    return rows


def _row(name: str, tag: str, real: dict[str, Any] | None, fake: dict[str, Any] | None) -> Row:
    if real is None or real.get("kind") == "missing":
        return Row(name, tag, ABSENT, "not in the real package")
    if fake is None or "params" not in real:
        kind = real.get("kind")
        return Row(name, tag, MATCHED if fake is None and kind != "function" else MISMATCH, "")
    state, detail = compare(fake, real)
    return Row(name, tag, state, detail)


def apply_deviations(rows: list[Row], deviations: dict[str, str]) -> tuple[list[Row], list[str]]:
    """Mark listed differences; return the rows and the failures (unlisted
    mismatches and absences, listed deviations that no longer occur)."""
    out: list[Row] = []
    failures: list[str] = []
    seen: set[str] = set()
    for r in rows:
        key = f"{r.name}@{r.tag}"
        if key not in deviations:
            key = f"{r.name}@*"  # the same difference at every tag
        if r.state in (MISMATCH, ABSENT) and key in deviations:
            seen.add(key)
            out.append(Row(r.name, r.tag, DEVIATION, deviations[key]))
            continue
        if r.state in (MISMATCH, ABSENT):
            where = f"AITER {r.tag}" if r.tag.startswith("v") else r.tag
            failures.append(f"{r.name} at {where}: {r.state}: {r.detail}")
        out.append(r)
    tags = {r.tag for r in rows}
    names = {r.name for r in rows}
    for key in sorted(deviations):
        name, _, tag = key.rpartition("@")
        if (tag in tags or (tag == "*" and name in names)) and key not in seen:
            failures.append(f"{key}: listed in deviations.json but the fake now agrees; drop it")
    return out, failures


def check_bases(root: Path = CONTRACTS, site: Path = SITE) -> tuple[list[Row], list[str]]:
    """Every comparison for every pinned base, and the failures."""
    bases = load("bases.json", root)
    deviations = load("deviations.json", root)
    fake = read_fake("aiter", site)
    failures: list[str] = []
    rows: list[Row] = []
    tags: dict[str, list[str]] = {}
    for version, pin in bases.items():
        tag = pin.get("contract")
        path = root / "aiter" / f"{tag}.json"
        if tag is None or not path.is_file():
            failures.append(
                f"base {version} pins AITER {pin.get('aiter')}: no contract "
                f"sim/contracts/aiter/{tag or pin.get('aiter')}.json "
                "(run scripts/aiter_contracts.py extract)"
            )
            continue
        tags.setdefault(tag, []).append(version)
    all_rows: list[Row] = []
    for tag in sorted(tags):
        all_rows += aiter_rows(tag, load(f"aiter/{tag}.json", root), fake)
    rows, aiter_failures = apply_deviations(all_rows, deviations)
    for f in aiter_failures:
        tag = f.split(" at AITER ", 1)[1].split(":", 1)[0] if " at AITER " in f else None
        failures.append(f"{f} (bases {', '.join(tags[tag])})" if tag in tags else f)
    amd_rows, amd_failures = check_amdsmi(bases, root, site, deviations)
    return rows + amd_rows, failures + amd_failures


def check_amdsmi(
    bases: dict[str, Any], root: Path, site: Path, deviations: dict[str, str]
) -> tuple[list[Row], list[str]]:
    fake = read_fake("amdsmi", site).get("amdsmi", FakeModule())
    failures: list[str] = []
    rows: list[Row] = []
    for contract_file in sorted((root / "amdsmi").glob("*.json")):
        contract = json.loads(contract_file.read_text())
        version = contract["version"]
        real = contract["names"]
        for base, pin in bases.items():
            for name in pin["amdsmi_imports"]:
                if name not in fake.names:
                    failures.append(
                        f"amdsmi.{name}: vLLM {base} imports it; the fake amdsmi lacks it"
                    )
                if name not in contract["exported"]:
                    failures.append(
                        f"amdsmi.{name}: vLLM {base} imports it; "
                        f"amdsmi {version} does not export it"
                    )
        for fname, sig in sorted(fake.functions.items()):
            rows.append(
                _row(f"amdsmi.{fname}", f"amdsmi {version}", real.get(f"amdsmi.{fname}"), sig)
            )
        for cname in sorted(fake.classes):
            entry = real.get(f"amdsmi.{cname}", {"kind": "missing"})
            rows.append(_row(f"amdsmi.{cname}", f"amdsmi {version}", entry, None))
    rows, more = apply_deviations(rows, deviations)
    return rows, sorted(set(failures)) + more


# ----------------------------------------------------------------------------
# golden outputs of AITER's PyTorch references (needs torch and the fake aiter)

# Weights may differ by float32 rounding only: the references renormalize by a
# sum taken in the order topk(sorted=False) leaves the picks, the fake in
# descending order, and CPUs of other vector widths (AVX-512 vs AVX2 kernels)
# round the softmax and the sum differently. A sum of k float32 terms in
# another order is off by at most k ulps: 8 (the largest topk of the golden
# cases) times float32's epsilon. Expert ids must be equal.
WEIGHT_RTOL = 8 * 2.0**-23


def golden_mismatches(aiter: Any, root: Path = CONTRACTS) -> tuple[int, list[str]]:
    """Run the fake's routing on every golden case; (cases compared, failures)."""
    import torch

    compared = 0
    failures: list[str] = []
    for path in sorted((root / "golden").glob("*.json")):
        data = json.loads(path.read_text())
        for i, case in enumerate(data["cases"]):
            if "not_comparable" in case:
                continue
            a = case["args"]
            x = torch.tensor(a["gating_output"], dtype=torch.float32)
            k = a["topk"]
            weights = torch.empty(x.shape[0], k, dtype=torch.float32)
            ids = torch.empty(x.shape[0], k, dtype=torch.int32)
            if case["function"] == "biased_grouped_topk_torch":
                bias = torch.tensor(a["correction_bias"], dtype=torch.float32)
                aiter.biased_grouped_topk(
                    x, bias, weights, ids, a["num_expert_group"], a["topk_group"], a["renormalize"]
                )
                fake_name = "biased_grouped_topk"
            else:
                aiter.grouped_topk(
                    x,
                    weights,
                    ids,
                    a["num_expert_group"],
                    a["topk_group"],
                    a["renormalize"],
                    a["scoring_func"] == "softmax",
                )
                fake_name = "grouped_topk"
            compared += 1
            order = ids.long().argsort(dim=-1)
            got_ids = ids.gather(1, order)
            got_w = weights.gather(1, order)
            want_ids = torch.tensor(case["expected"]["topk_ids"], dtype=torch.int32)
            want_w = torch.tensor(case["expected"]["topk_weights"], dtype=torch.float32)
            where = f"aiter.{fake_name} vs {case['function']} at AITER {', '.join(data['tags'])}"
            if not torch.equal(got_ids, want_ids):
                failures.append(
                    f"{where}, case {i} ({case['why']}): ids {got_ids.tolist()} != "
                    f"{want_ids.tolist()}"
                )
            elif not torch.allclose(got_w, want_w, rtol=WEIGHT_RTOL, atol=0.0):
                failures.append(
                    f"{where}, case {i} ({case['why']}): weights {got_w.tolist()} != "
                    f"{want_w.tolist()}"
                )
    return compared, failures


def table(rows: list[Row]) -> str:
    """Markdown table name x tag of the comparison states (for CONTRACTS.md)."""
    tags = sorted({r.tag for r in rows}, key=lambda t: (not t.startswith("v"), t))
    names = sorted({r.name for r in rows})
    cell = {(r.name, r.tag): r.state for r in rows}
    lines = ["| name | " + " | ".join(tags) + " |", "|---|" + "---|" * len(tags)]
    for name in names:
        label = name.replace("aiter.dist.device_communicators.custom_all_reduce.", "")
        label = label.replace("aiter.ops.triton.rope.rope.", "aiter…rope.")
        lines.append(f"| `{label}` | " + " | ".join(cell.get((name, t), "") for t in tags) + " |")
    return "\n".join(lines)
