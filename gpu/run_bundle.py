# SPDX-License-Identifier: Apache-2.0
"""Run a GPU test bundle (made by ``vllm-fork gpu-bundle``) on a GPU host.

Standard library only: the host has Python with torch, nothing of the fork.
Reads ``manifest.json`` next to it: the runs (which tree, the ROCm simulation
or not, the rotary kernel to build or not, which test files). Installs the
bundle's wheels the host lacks into a venv over the host's packages
(``--system-site-packages``), builds the rotary kernels in parallel, runs each
run's pytest with a JUnit report, and writes ``summary.json`` and
``summary.md``: per test, its result with the fork's patches and, for a test
that guards a patch, without that patch.

Usage: python3 run_bundle.py [--out DIR] [--venv DIR] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # the bundle


def log(msg: str) -> None:
    print(f"[gpu-bundle] {msg}", flush=True)


def make_venv(where: Path, wheels: Path) -> Path:
    python = where / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(system_site_packages=True, with_pip=False).create(where)
    # The host's Python may itself be a venv (its torch not in the base
    # interpreter's site-packages): a .pth file makes its packages visible.
    host_site = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    new_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(new_site, "host-site.pth").write_text("".join(f"{p}\n" for p in sorted(host_site)))
    have = {d.metadata["Name"].lower().replace("_", "-") for d in metadata.distributions()}
    todo = []
    for wheel in sorted(wheels.glob("*.whl")):
        name = wheel.name.split("-")[0].lower().replace("_", "-")
        if name not in have:
            todo.append(str(wheel))
    if todo:
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--target",
            site,
            *todo,
        ]
        subprocess.run(cmd, check=True)
    log(f"venv {where}: {len(todo)} wheel(s) installed over the host's packages")
    return python


def tree_of(run: dict, work: Path) -> Path:
    """The run's tree: the bundle's tree, or a copy with a patch's overlay."""
    tree = HERE / "tree"
    overlay = run.get("overlay")
    if not overlay:
        return tree
    dest = work / run["name"]
    if not dest.exists():
        shutil.copytree(tree, dest, symlinks=True)
        src = HERE / overlay
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            rel = path.relative_to(src)
            target = dest / rel
            if path.name.endswith(".fork-absent"):
                Path(str(target).removesuffix(".fork-absent")).unlink(missing_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    return dest


def build_kernel(python: Path, tree: Path, build: Path) -> tuple[bool, str]:
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
        "import fork_gpu; fork_gpu.load_rope_kernel(Path(sys.argv[2]), Path(sys.argv[3]))"
    )
    proc = subprocess.run(
        [str(python), "-c", code, str(HERE / "gpu"), str(tree), str(build)],
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def cases(junit: Path) -> dict[str, str]:
    if not junit.exists():
        return {}
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        result = "passed"
        for tag in ("error", "failure", "skipped"):
            if case.find(tag) is not None:
                result = {"failure": "failed"}.get(tag, tag)
                break
        # The module's file name: the same in the tree and in its copies.
        out[f"{Path(case.get('file') or '').name}::{case.get('name')}"] = result
    return out


def run_pytest(python: Path, run: dict, tree: Path, build: Path | None, out: Path) -> dict:
    """One pytest process for the run's files; where it dies of a signal,
    each file again in a process of its own, so that a crash in one module
    costs only that module's results (the crashed one is named)."""
    result = _pytest(python, run, tree, build, out, run["files"], run["name"])
    if result["returncode"] >= 0 or len(run["files"]) < 2:
        return result
    cases: dict[str, str] = {}
    crashed = []
    for n, rel in enumerate(run["files"], 1):
        # -v: the log names the test a crash stopped at.
        one = _pytest(python, run, tree, build, out, [rel], f"{run['name']}.{n:02d}", "-v")
        cases.update(one["cases"])
        if one["returncode"] < 0:
            crashed.append(f"{Path(rel).name} (signal {-one['returncode']})")
    result["cases"] = cases
    result["crashed"] = crashed
    result["counts"] = _counts(cases)
    log(f"{run['name']}: per module: {result['counts']}, crashed: {crashed or 'none'}")
    return result


def _counts(cases: dict[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in cases.values():
        counts[r] = counts.get(r, 0) + 1
    return counts


def _pytest(
    python: Path,
    run: dict,
    tree: Path,
    build: Path | None,
    out: Path,
    run_files: list[str],
    name: str,
    *extra: str,
) -> dict:
    env = dict(os.environ)
    paths = [str(tree), str(HERE / "gpu")]
    plugins = ["-p", "fork_gpu"]
    if run.get("sim"):
        paths.append(str(HERE / "sim"))
        plugins = ["-p", "vllm_rocm_sim.plugin", *plugins]
    # vLLM's version: its CUDA platform detection and (0.33.0) its Triton
    # check read it; under the simulation fork_gpu keeps the CUDA platform off.
    paths.append(str(HERE / "meta"))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("FORK_GPU_KERNEL", None)
    if build is not None:
        env["FORK_GPU_KERNEL"] = str(tree)
        env["FORK_GPU_BUILD"] = str(build)
    files = [f for f in run_files if (tree / f).exists() or (HERE / f).exists()]
    files = [str(tree / f) if (tree / f).exists() else str(HERE / f) for f in files]
    junit = out / f"{name}.xml"
    cmd = [
        str(python),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        f"--rootdir={tree}",
        "-o",
        "junit_family=xunit1",
        "-c",
        str(HERE / "gpu" / "pytest.ini"),
        *plugins,
        f"--junitxml={junit}",
        "--continue-on-collection-errors",
        "-rfE",
        *extra,
        *files,
    ]
    start = time.monotonic()
    with open(out / f"{name}.log", "w") as fh:
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=fh, stderr=subprocess.STDOUT)
    result = {
        "name": run["name"],
        "returncode": proc.returncode,
        "seconds": round(time.monotonic() - start, 1),
        "cases": cases(junit),
    }
    result["counts"] = _counts(result["cases"])
    log(f"{name}: exit {proc.returncode}, {result['counts']}, {result['seconds']} s")
    return result


def verdicts(manifest: dict, results: dict[str, dict]) -> list[dict]:
    """Per test of the fork run: its result, and for a test guarding a patch,
    its result on the tree without that patch."""
    rows = []
    for run in manifest["runs"]:
        if run.get("overlay"):
            continue
        for case, result in sorted(results[run["name"]]["cases"].items()):
            row = {"test": case, "with": result, "without": {}}
            for other in manifest["runs"]:
                if other.get("of") != run["name"]:
                    continue
                other_result = results[other["name"]]
                without = other_result["cases"].get(case)
                files = {Path(f).name for f in other["files"]}
                crashed = other_result["returncode"] < 0
                if without is None and crashed and case.split("::")[0] in files:
                    without = f"crashed (signal {-other_result['returncode']})"
                if without is not None:
                    row["without"][other["patch"]] = without
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--venv", type=Path, default=Path("/tmp/fork-gpu-venv"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/fork-gpu-work"))
    parser.add_argument("--jobs", type=int, default=4)
    args = parser.parse_args()
    manifest = json.loads((HERE / "manifest.json").read_text())
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.work = args.work / manifest["base"]
    args.work.mkdir(parents=True, exist_ok=True)
    python = make_venv(args.venv, HERE / "wheels")
    env_info = subprocess.run(
        [
            str(python),
            "-c",
            "import torch, platform; print('python', platform.python_version());"
            "print('torch', torch.__version__, 'cuda', torch.version.cuda);"
            "print('device', torch.cuda.get_device_name() if torch.cuda.is_available() else '-')",
        ],
        capture_output=True,
        text=True,
    )
    (out / "env.txt").write_text(
        f"bundle of vLLM {manifest['base']} (fork series {manifest['series_head']})\n"
        + env_info.stdout
        + env_info.stderr
    )
    log(env_info.stdout.strip().replace("\n", "; "))
    cuda = "device -" not in env_info.stdout and "device" in env_info.stdout
    trees = {run["name"]: tree_of(run, args.work) for run in manifest["runs"]}
    builds: dict[str, Path | None] = {}
    kernel_runs = [r for r in manifest["runs"] if r.get("kernel")]
    build_log = []
    if cuda and kernel_runs:

        def build(run):
            where = args.work / "build" / run["name"]
            ok, text = build_kernel(python, trees[run["name"]], where)
            return run["name"], where, ok, text

        with ThreadPoolExecutor(max(1, min(len(kernel_runs), 8))) as pool:
            for name, where, ok, text in pool.map(build, kernel_runs):
                builds[name] = where if ok else None
                log(f"kernel of {name}: {'built' if ok else 'BUILD FAILED'}")
                if not ok:
                    build_log.append(f"== {name}\n{text}")
        (out / "kernel-build.log").write_text("\n".join(build_log) or "all built\n")
    results: dict[str, dict] = {}

    def one(run):
        build = builds.get(run["name"]) if run.get("kernel") else None
        return run["name"], run_pytest(python, run, trees[run["name"]], build, out)

    with ThreadPoolExecutor(args.jobs) as pool:
        for name, result in pool.map(one, manifest["runs"]):
            results[name] = result
    summary = {
        "base": manifest["base"],
        "series_head": manifest["series_head"],
        "runs": [{k: v for k, v in r.items() if k != "cases"} for r in results.values()],
        "tests": verdicts(manifest, results),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        f"# GPU tests of vLLM {manifest['base']} + fork series",
        "",
        "| run | exit | results | seconds |",
        "|---|---|---|---|",
    ]
    for r in summary["runs"]:
        counts = r["counts"]
        if r.get("crashed"):
            counts = f"{counts}; crashed: {', '.join(r['crashed'])}"
        lines.append(f"| {r['name']} | {r['returncode']} | {counts} | {r['seconds']} |")
    lines += ["", "| test | with the fork | without the patch |", "|---|---|---|"]
    for row in summary["tests"]:
        without = "; ".join(f"{v} without '{k}'" for k, v in row["without"].items()) or "-"
        lines.append(f"| {row['test']} | {row['with']} | {without} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    fork = [r for r in manifest["runs"] if not r.get("overlay")]
    bad = any(results[r["name"]]["returncode"] not in (0, 5) for r in fork)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
