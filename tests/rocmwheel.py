"""A synthetic upstream ROCm wheel of a real base, and a PEP 503 index serving it.

No real ROCm wheel can be fetched here, so the tests make one with the layout of
upstream's: ``vllm-<V>+rocm<NNN>-cp312-cp312-manylinux_2_34_x86_64.whl`` holding

- the Python package and data files of upstream's (CUDA) wheel of the same
  version, less what only a CUDA build copies in (FlashMLA, DeepGEMM, the
  flash-attention builds): a ROCm build of the same sources ships the same
  Python files;
- the binaries vLLM's precompiled path copies for ROCm, as small stand-ins:
  ``vllm/_C.abi3.so``, ``vllm/_moe_C.abi3.so``, ``vllm/cumem_allocator.abi3.so``
  and ``vllm/_rocm_C.abi3.so``;
- METADATA with the requirements of the base's ``requirements/rocm.txt``, the
  ``+rocmNNN`` local version, WHEEL tagged ``cp312-cp312``.

Run it to reproduce the ROCm main job by hand (it serves until interrupted)::

    .venv/bin/python -m tests.rocmwheel serve --base 0.21.0 /tmp/rocm-index
    vllm-fork pin 0.21.0 --rocm-index http://127.0.0.1:PORT/simple/
    scripts/main.sh --device rocm
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import re
import threading
import zipfile
from pathlib import Path

from vllm_fork.facts.names import tag_for
from vllm_fork.git import git_out
from vllm_fork.sources.upstream import ensure_upstream
from vllm_fork.sources.workspace import Workspace, load_config
from vllm_fork.wheel.audit import record_hashes
from vllm_fork.wheel.wheelfile import Wheel

from .wheelutil import version_py, write_wheel

ROCM_TAG = "cp312-cp312-manylinux_2_34_x86_64"
ROCM_BINARIES = (
    "vllm/_C.abi3.so",
    "vllm/_moe_C.abi3.so",
    "vllm/cumem_allocator.abi3.so",
    "vllm/_rocm_C.abi3.so",
)
# what only a CUDA build copies in from its wheel (vLLM's precompiled path, setup.py)
CUDA_ONLY = re.compile(
    r"^vllm/(_C_stable_libtorch|_flashmla_C|_flashmla_extension_C|_sparse_flashmla_C"
    r"|_deep_gemm_C)\.abi3\.so$"
    r"|^vllm/third_party/(flashmla|deep_gemm)/"
    r"|^vllm/vllm_flash_attn/(?!__init__\.py$|flash_attn_interface\.py$)"
)


def stand_in_binary(name: str, variant: str) -> bytes:
    return f"\x7fELF synthetic {variant} stand-in for {name}\n".encode()


def rocm_requirements(config: Workspace, version: str) -> list[str]:
    """The Requires-Dist lines vLLM's setup.py writes for ROCm: requirements/rocm.txt
    with its ``-r`` includes, read from the imported sdist."""
    tag = tag_for(version)

    def read(name: str) -> list[str]:
        text = git_out(["show", f"{tag}:requirements/{name}"], cwd=config.upstream_repo)
        out: list[str] = []
        for line in text.strip().split("\n"):
            if line.startswith("-r "):
                out += read(line.split()[1])
            elif line.strip() and not line.startswith(("--", "#")):
                out.append(line)
        return out

    return read("rocm.txt")


def make_rocm_wheel(
    config: Workspace,
    version: str,
    directory: Path,
    *,
    variant: str = "rocm700",
    tag: str = ROCM_TAG,
    wheel_version: str | None = None,
) -> Path:
    """Write the synthetic ROCm wheel of base ``version`` into ``directory``;
    ``wheel_version``: the public version it claims (default ``version``)."""
    base = config.base(version) if hasattr(config, "base") else None
    assert base is not None and base.wheel is not None, "needs the base's pinned CUDA wheel"
    ensure_upstream(config, base)  # type: ignore[arg-type]
    cuda = config.fetcher.ensure(base.wheel)  # type: ignore[attr-defined]
    claimed = f"{wheel_version or version}+{variant}"
    # files of the sources are in every build's wheel; only copied-in ones are CUDA's
    sources = set(
        git_out(
            ["ls-tree", "-r", "--name-only", tag_for(version), "--", "vllm"],
            cwd=config.upstream_repo,
        ).split("\n")
    )
    files: dict[str, bytes] = {}
    with Wheel(cuda) as w, zipfile.ZipFile(cuda) as zf:
        members = [p for p in record_hashes(w) if not p.startswith("{dist-info}")]
        for path in members:
            if path.endswith(".so") or (CUDA_ONLY.search(path) and path not in sources):
                continue
            files[path] = zf.read(path)
        meta = zf.read(f"{w.dist_info}/METADATA").decode()
        prefix = f"{w.dist_info}/"
        extras = {
            name[len(prefix) :]: zf.read(name)
            for name in zf.namelist()
            if name.startswith(prefix)
            and name[len(prefix) :] not in ("METADATA", "WHEEL", "RECORD")
        }
    for name in ROCM_BINARIES:
        files[name] = stand_in_binary(name, variant)
    files["vllm/_version.py"] = version_py(claimed)
    head = [
        line
        for line in meta.split("\n\n", 1)[0].splitlines()
        if not line.startswith("Version:")
        and not (line.startswith("Requires-Dist:") and "extra ==" not in line)
    ]
    head.insert(2, f"Version: {claimed}")
    head += [
        f"Requires-Dist: {r.split('#', 1)[0].strip()}" for r in rocm_requirements(config, version)
    ]
    dist_info = f"vllm-{claimed}.dist-info"
    for name, data in extras.items():
        files[f"{dist_info}/{name}"] = data
    directory.mkdir(parents=True, exist_ok=True)
    path = write_wheel(directory / f"vllm-{claimed}-{tag}.whl", files, claimed, tag)
    # write_wheel's METADATA is minimal: put the real one in (RECORD rewritten)
    return _with_metadata(path, dist_info, "\n".join(head) + "\n")


def _with_metadata(path: Path, dist_info: str, metadata: str) -> Path:
    import csv
    import io

    from vllm_fork.wheel.wheelfile import record_digest

    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    members[f"{dist_info}/METADATA"] = metadata.encode()
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    record = f"{dist_info}/RECORD"
    for name, data in members.items():
        if name != record:
            writer.writerow([name, record_digest(data), str(len(data))])
    writer.writerow([record, "", ""])
    members[record] = out.getvalue().encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():  # fixed times: the same wheel every run
            zf.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_index(root: Path, wheels: list[Path], digests: dict[str, str] | None = None) -> Path:
    """A PEP 503 tree under ``root``: ``simple/vllm/index.html`` linking ``files/<wheel>``
    with ``#sha256=`` (``digests`` overrides a file's, to serve a wrong one)."""
    store = root / "files"
    store.mkdir(parents=True, exist_ok=True)
    links = []
    for wheel in wheels:
        target = store / wheel.name
        if target.resolve() != wheel.resolve():
            target.write_bytes(wheel.read_bytes())
        digest = (digests or {}).get(wheel.name) or sha256_of(target)
        links.append(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a><br/>')
    page = root / "simple" / "vllm"
    page.mkdir(parents=True, exist_ok=True)
    (page / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"
    )
    return root / "simple"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``root`` on 127.0.0.1 (a free port) from a thread; (server, simple URL)."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root))
    )
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/simple/"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.rocmwheel")
    parser.add_argument("action", choices=["serve", "write"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--base", default=None)
    parser.add_argument("--variant", default="rocm700")
    args = parser.parse_args(argv)
    config = load_config()
    version = config.base(args.base).version
    wheel = make_rocm_wheel(config, version, args.directory / "build", variant=args.variant)
    simple = write_index(args.directory, [wheel])
    print(f"{wheel.name} sha256 {sha256_of(wheel)}")
    if args.action == "write":
        print(f"index: {simple.as_uri()}/")
        return 0
    server, url = serve(args.directory)
    print(f"serving {url} (Ctrl-C stops it)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
