"""The build's environment and command, per mode and device, and the early checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.errors import UnsupportedBaseError, UsageError
from vllm_fork.wheel.builder import BuildRequest, build
from vllm_fork.wheel.env import BuildEnvError, PythonInfo, check_build_python, check_toolchain
from vllm_fork.wheel.options import load_full_options, parse_source_option
from vllm_fork.wheel.plan import SCRUBBED, FullOptions, PlanError, plan_build

from .buildutil import make_series, pin_wheel, python_patch
from .conftest import ForkRepo

TREE = Path("/build/src")
OUT = Path("/build/dist")
WHEEL = Path("/cache/dist/vllm-0.21.0-1-cp38-abi3-manylinux_2_24_x86_64.whl")
PLAT = "manylinux_2_24_x86_64"


def plan(mode: str, device: str = "cuda", full: FullOptions | None = None, **kw):
    return plan_build(
        mode=mode,
        device=device,
        python="/env/bin/python",
        tree=TREE,
        out_dir=OUT,
        version="0.21.0+hardened.4",
        source_date_epoch=1779364800,
        plat_name=PLAT,
        upstream_wheel=WHEEL if mode == "precompiled" else None,
        full=full,
        **kw,
    )


def settings(p) -> dict:
    assert p.python == "/env/bin/python" and p.out_dir == OUT
    assert p.backend is None  # no tree yet: read from its pyproject.toml at build time
    json.dumps(p.config_settings)  # passed to the hook as JSON
    return p.config_settings


def test_precompiled_plan() -> None:
    p = plan("precompiled")
    assert p.set_env == {
        "VLLM_TARGET_DEVICE": "cuda",
        "VLLM_USE_PRECOMPILED": "1",
        "VLLM_PRECOMPILED_WHEEL_LOCATION": str(WHEEL),
        "VLLM_VERSION_OVERRIDE": "0.21.0+hardened.4",
        "SOURCE_DATE_EPOCH": "1779364800",
        "PYTHONNOUSERSITE": "1",
    }
    assert settings(p) == {"--build-option": ["--py-limited-api=cp38", f"--plat-name={PLAT}"]}


def test_offline_plan_refuses_the_network_at_once() -> None:
    """--offline: pip has no index, proxies point at a refused loopback port, and a
    full build's CMake may not download what it fetches at configure time."""
    online, offline = plan("precompiled"), plan("precompiled", offline=True)
    added = {k: v for k, v in offline.set_env.items() if k not in online.set_env}
    assert added["PIP_NO_INDEX"] == "1"
    assert added["HF_HUB_OFFLINE"] == "1"
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        assert added[name] == "http://127.0.0.1:9"
    assert added["no_proxy"] == added["NO_PROXY"] == ""
    assert "CMAKE_ARGS" not in offline.set_env
    full = plan("full", offline=True)
    assert full.set_env["CMAKE_ARGS"] == "-DFETCHCONTENT_FULLY_DISCONNECTED=ON"
    assert "CMAKE_ARGS" not in plan("full").set_env


def test_full_cuda_plan() -> None:
    full = FullOptions(
        cuda_archs="9.0a 10.0",
        max_jobs=32,
        nvcc_threads=4,
        build_type="Release",
        sources={
            "cutlass": Path("/src/cutlass"),
            "flash-attn": Path("/src/fa"),
            "flashmla": Path("/src/flashmla"),
            "deepgemm": Path("/src/dg"),
            "qutlass": Path("/src/qutlass"),
            "triton-kernels": Path("/src/tk"),
        },
        ccache="/usr/bin/ccache",
    )
    p = plan("full", "cuda", full)
    assert p.set_env == {
        "VLLM_TARGET_DEVICE": "cuda",
        "TORCH_CUDA_ARCH_LIST": "9.0a 10.0",
        "MAX_JOBS": "32",
        "NVCC_THREADS": "4",
        "CMAKE_BUILD_TYPE": "Release",
        "VLLM_CUTLASS_SRC_DIR": "/src/cutlass",
        "VLLM_FLASH_ATTN_SRC_DIR": "/src/fa",
        "FLASH_MLA_SRC_DIR": "/src/flashmla",
        "DEEPGEMM_SRC_DIR": "/src/dg",
        "QUTLASS_SRC_DIR": "/src/qutlass",
        "TRITON_KERNELS_SRC_DIR": "/src/tk",
        "CMAKE_C_COMPILER_LAUNCHER": "/usr/bin/ccache",
        "CMAKE_CXX_COMPILER_LAUNCHER": "/usr/bin/ccache",
        "CMAKE_CUDA_COMPILER_LAUNCHER": "/usr/bin/ccache",
        "CCACHE_BASEDIR": str(TREE),
        "CCACHE_NOHASHDIR": "1",
        "VLLM_VERSION_OVERRIDE": "0.21.0+hardened.4",
        "SOURCE_DATE_EPOCH": "1779364800",
        "PYTHONNOUSERSITE": "1",
    }
    assert settings(p)["--build-option"] == ["--py-limited-api=cp38", f"--plat-name={PLAT}"]


def test_full_rocm_plan() -> None:
    p = plan("full", "rocm", FullOptions(rocm_archs="gfx942", ccache="/usr/bin/ccache"))
    env = p.set_env
    assert env["VLLM_TARGET_DEVICE"] == "rocm"
    assert env["PYTORCH_ROCM_ARCH"] == "gfx942"
    assert env["CMAKE_HIP_COMPILER_LAUNCHER"] == "/usr/bin/ccache"
    for absent in (
        "TORCH_CUDA_ARCH_LIST",
        "NVCC_THREADS",
        "CMAKE_CUDA_COMPILER_LAUNCHER",
        "VLLM_USE_PRECOMPILED",
        "MAX_JOBS",
    ):
        assert absent not in env
    # defaults: the fork's MI300/MI355 targets, no ccache unless found
    assert plan("full", "rocm").set_env["PYTORCH_ROCM_ARCH"] == "gfx942;gfx950"
    assert "CMAKE_C_COMPILER_LAUNCHER" not in plan("full", "rocm").set_env


def test_empty_plan_is_pure_python() -> None:
    p = plan("empty")
    assert p.set_env["VLLM_TARGET_DEVICE"] == "empty"
    assert "VLLM_USE_PRECOMPILED" not in p.set_env
    assert settings(p) == {}
    assert p.plat_name is None


def test_caller_environment_is_scrubbed() -> None:
    p = plan("full", "cuda")
    env = p.environ(
        {
            "PATH": "/bin",
            "VLLM_USE_PRECOMPILED": "1",
            "PYTHONPATH": "/x",
            "VLLM_PRECOMPILED_WHEEL_LOCATION": "/other.whl",
            "MAX_JOBS": "7",
        }
    )
    assert env["PATH"] == "/bin"
    assert "VLLM_USE_PRECOMPILED" not in env and "PYTHONPATH" not in env
    assert "VLLM_PRECOMPILED_WHEEL_LOCATION" not in env
    assert env["MAX_JOBS"] == "7"  # a caller's MAX_JOBS stays unless the plan sets one
    assert set(SCRUBBED) >= {"VLLM_VERSION_OVERRIDE", "VLLM_CUTLASS_SRC_DIR"}
    text = p.render({"PYTHONPATH": "/x"})
    assert "unset PYTHONPATH" in text and "unset VLLM_USE_PRECOMPILED" not in text
    assert "export TORCH_CUDA_ARCH_LIST='7.5 8.0 8.6 8.9 9.0 10.0 11.0 12.0+PTX'" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "precompiled", "device": "rocm"}, "pinned ROCm wheel.s version"),
        ({"mode": "full", "full": FullOptions(sources={"cutlas": Path("/x")})}, "cutlas"),
        ({"mode": "full", "device": "rocm", "full": FullOptions(nvcc_threads=2)}, "NVCC"),
        ({"mode": "nightly"}, "unknown build mode"),
        ({"mode": "full", "device": "xpu"}, "unknown device"),
    ],
)
def test_plan_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan(**kwargs)


def test_build_config_file(tmp_path: Path) -> None:
    (tmp_path / "cutlass").mkdir()
    conf = tmp_path / "build.toml"
    conf.write_text(
        '[full]\ncuda-archs = "9.0"\nmax-jobs = 8\nccache = false\n'
        '[full.sources]\ncutlass = "cutlass"\ndeepgemm = "/abs/DeepGEMM"\n'
    )
    options, use_ccache = load_full_options(conf)
    assert options.cuda_archs == "9.0" and options.max_jobs == 8 and not use_ccache
    assert options.sources == {"cutlass": tmp_path / "cutlass", "deepgemm": Path("/abs/DeepGEMM")}
    conf.write_text("[full]\nmax-jobs = 0\n")
    with pytest.raises(UsageError, match="positive integer"):
        load_full_options(conf)
    conf.write_text('[full.sources]\nflash_attn = "/x"\n')
    with pytest.raises(UsageError, match="unknown source 'flash_attn'"):
        load_full_options(conf)
    assert parse_source_option("qutlass=/q") == ("qutlass", Path("/q"))
    with pytest.raises(UsageError):
        parse_source_option("qutlass")


def info(**kw) -> PythonInfo:
    packages = {
        "torch": "2.11.0+cu130",
        "setuptools": "80.10.2",
        "setuptools-scm": "10.3.4",
        "cmake": "4.1",
        "ninja": "1.13",
        "packaging": "25.0",
    }
    packages.update(kw.pop("packages", {}))
    return PythonInfo(
        python="/env/bin/python",
        version="3.11",
        packages=packages,
        torch_cuda=kw.get("torch_cuda", "13.0"),
        torch_hip=kw.get("torch_hip"),
        torch_error=kw.get("torch_error"),
    )


def test_build_python_checks() -> None:
    assert check_build_python(info(), "precompiled", "cuda", "2.11.0") == []
    cpu = info(torch_cuda=None, packages={"torch": "2.13.0+cpu"})
    assert (
        "a CUDA build of torch is needed" in check_build_python(cpu, "precompiled", "cuda", None)[0]
    )
    assert check_build_python(cpu, "empty", "cuda", "2.11.0") == []
    new_setuptools = info(packages={"setuptools": "81.0.0"})
    assert "setuptools>=77.0.3,<81" in check_build_python(new_setuptools, "empty", "cuda", None)[0]
    other_torch = info(packages={"torch": "2.14.1"})
    assert check_build_python(other_torch, "precompiled", "cuda", "2.11.0") == []
    assert "pins torch 2.11.0" in check_build_python(other_torch, "full", "cuda", "2.11.0")[0]
    assert "ROCm build of torch" in check_build_python(info(), "full", "rocm", "2.11.0")[0]


def test_toolchain_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    monkeypatch.setattr("vllm_fork.wheel.env.Path.is_file", lambda self: False)
    assert "nvcc not found" in check_toolchain("cuda", info())[0]
    assert "hipcc not found" in check_toolchain("rocm", info(torch_hip="7.1"))[0]


def test_toolchain_version_mismatch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert "nvcc 12.8" in check_toolchain("cuda", info(torch_cuda="13.0"))[0]
    assert check_toolchain("cuda", info(torch_cuda="12.9")) == []


def test_full_build_fails_early_without_toolchain(
    fork_repo: ForkRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pin_wheel(fork_repo)
    make_series(fork_repo, tmp_path, python_patch)

    def boom(*args: object, **kw: object) -> None:
        raise AssertionError("materialize must not run")

    monkeypatch.setattr("vllm_fork.wheel.builder.materialize", boom)
    # A build Python with a ROCm torch, on a machine without hipcc.
    probe = {
        "python": "3.11",
        "torch": "2.11.0+rocm7.1",
        "setuptools": "80.10.2",
        "setuptools-scm": "10.3.4",
        "cmake": "4.1",
        "ninja": "1.13",
        "packaging": "25",
        "torch_cuda": None,
        "torch_hip": "7.1",
    }
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(probe)}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'empty'}:/usr/bin:/bin")
    req = BuildRequest(
        mode="full", device="rocm", build_python=str(fake), out_dir=tmp_path / "dist"
    )
    with pytest.raises(BuildEnvError) as exc:
        build(fork_repo.config, req)
    assert "hipcc not found" in str(exc.value)
    assert "Dockerfile.rocm" in str(exc.value)
    assert not (tmp_path / "dist").exists()  # nothing was built or created
    # with hipcc there, a build Python with a CPU-only torch is refused, still early
    hipcc = tmp_path / "rocm" / "bin" / "hipcc"
    hipcc.parent.mkdir(parents=True)
    hipcc.write_text("#!/bin/sh\n")
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    probe.update(torch="2.13.0+cpu", torch_hip=None)
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(probe)}'\n")
    with pytest.raises(BuildEnvError, match="ROCm build of torch is needed"):
        build(fork_repo.config, req)
    assert not (tmp_path / "dist").exists()


def test_missing_source_dir_is_reported(fork_repo: ForkRepo, tmp_path: Path) -> None:
    pin_wheel(fork_repo)
    make_series(fork_repo, tmp_path, python_patch)
    req = BuildRequest(mode="full", full=FullOptions(sources={"cutlass": tmp_path / "nope"}))
    with pytest.raises(UsageError, match="source cutlass \\(VLLM_CUTLASS_SRC_DIR\\)"):
        build(fork_repo.config, req)


def test_build_itself_refuses_an_empty_series(fork_repo: ForkRepo) -> None:
    """Whoever calls build() (the CLI, release-check): a base with no patches is
    refused before any work, as the wheel would claim hardening it lacks."""
    pin_wheel(fork_repo)
    calls: list[object] = []
    with pytest.raises(UnsupportedBaseError, match="has no patches"):
        build(fork_repo.config, BuildRequest(), runner=lambda *a: calls.append(a) or "x.whl")
    assert calls == []


def test_cli_dry_run(
    fork_repo: ForkRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pin_wheel(fork_repo)
    make_series(fork_repo, tmp_path, python_patch)
    (tmp_path / "fa").mkdir()
    assert (
        main(
            [
                "build",
                "--mode",
                "full",
                "--device",
                "cuda",
                "--dry-run",
                "--max-jobs",
                "3",
                "--source",
                f"flash-attn={tmp_path / 'fa'}",
                "--no-ccache",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "vllm-9.9.9+hardened.1 (full, cuda)" in out
    assert "export MAX_JOBS=3" in out
    assert f"export VLLM_FLASH_ATTN_SRC_DIR={tmp_path / 'fa'}" in out
    assert "--plat-name=manylinux_2_28_x86_64" in out
    assert "docker/Dockerfile.rocm" in out
    assert "CMAKE_C_COMPILER_LAUNCHER" not in out


# An in-tree PEP 517 backend (named by the tree's pyproject.toml, found through its
# backend-path) that writes a small fork wheel the way vLLM's build would: the tree's
# vllm/ files, the version from VLLM_VERSION_OVERRIDE, a correct RECORD. Meanwhile
# another run takes the cache lock, as a download would.
FAKE_BACKEND = """\
import base64, csv, hashlib, io, os, warnings, zipfile
from pathlib import Path


def _digest(data):
    raw = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + raw.decode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    from vllm_fork.lock import cache_lock

    with cache_lock(Path(os.environ["VLLM_FORK_CACHE_DIR"])):
        pass
    version = os.environ["VLLM_VERSION_OVERRIDE"]
    files = {p.as_posix(): p.read_bytes() for p in sorted(Path("vllm").rglob("*")) if p.is_file()}
    files["vllm/_version.py"] = f"__version__ = version = '{version}'\\n".encode()
    info = f"vllm-{version}.dist-info"
    metadata = f"Metadata-Version: 2.4\\nName: vllm\\nVersion: {version}\\n"
    files[f"{info}/METADATA"] = metadata.encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    out = io.StringIO()
    rows = csv.writer(out, lineterminator="\\n")
    for name, data in files.items():
        rows.writerow([name, _digest(data), len(data)])
    rows.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = out.getvalue().encode()
    name = f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    warnings.warn("setuptools-scm: a noisy backend warning")
    print("creating build/not-this.whl")  # a last log line that names another file
    return name
"""


def in_tree_backend(tree: Path) -> None:
    from .gitutil import commit, trailer_block

    commit(
        tree,
        "[Build] Build with an in-tree backend",
        "A PEP 517 backend kept in the tree.",
        trailer_block(part="support"),
        {
            "pyproject.toml": '[build-system]\nbuild-backend = "fake_backend"\n'
            'backend-path = ["_build"]\n',
            "_build/fake_backend.py": FAKE_BACKEND,
        },
    )


def fake_build_python(tmp_path: Path) -> Path:
    """A build Python whose probe reports a usable environment; it runs everything else."""
    import sys

    probe = {"python": "3.11", "torch": "2.11.0+cpu", "setuptools": "80.10.2"}
    probe.update({"setuptools-scm": "10.3.4", "torch_cuda": None, "torch_hip": None})
    fake = tmp_path / "build-python"
    fake.write_text(
        "#!/bin/sh\n"
        f"case \"$*\" in *pyinfo.py*) echo '{json.dumps(probe)}' ;; "
        f'*) exec {sys.executable} "$@" ;; esac\n'
    )
    fake.chmod(0o755)
    return fake


def test_read_backend(tmp_path: Path) -> None:
    from vllm_fork.wheel.plan import LEGACY_BACKEND, Backend, read_backend

    assert read_backend(tmp_path) == Backend(LEGACY_BACKEND)  # PEP 517: no pyproject.toml
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    assert read_backend(tmp_path) == Backend("setuptools.build_meta")
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nbuild-backend = "be"\nbackend-path = ["tools"]\n'
    )
    assert read_backend(tmp_path) == Backend("be", ("tools",))
    (tmp_path / "pyproject.toml").write_text('[build-system]\nbackend-path = "tools"\n')
    with pytest.raises(PlanError, match="backend-path"):
        read_backend(tmp_path)


def count_loads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count parses of bases.toml, series reads and fetchers made from now on."""
    from vllm_fork.sources import fetch, workspace

    counts = {"pins": 0, "series": 0, "fetchers": 0}

    def counting(name: str, func):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return func(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(workspace, "load_pins", counting("pins", workspace.load_pins))
    monkeypatch.setattr(workspace, "load_series", counting("series", workspace.load_series))
    monkeypatch.setattr(fetch.Fetcher, "__init__", counting("fetchers", fetch.Fetcher.__init__))
    return counts


def test_build_calls_the_trees_backend_and_survives_the_cache_lock(
    fork_repo: ForkRepo,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    recwarn: pytest.WarningsRecorder,
) -> None:
    """The backend named by the tree's pyproject.toml builds the wheel through the hook;
    the wheel is the one the hook names; the build tree outlives a cache lock taken
    meanwhile by another run (which empties <cache>/tmp); --json prints one object."""
    import hashlib

    make_series(fork_repo, tmp_path, python_patch, in_tree_backend)
    dist = tmp_path / "dist"
    loads = count_loads(monkeypatch)
    # The delta audit against upstream's wheel (test_audit.py) needs a pinned upstream
    # wheel, which an empty build of this base has not: record that verify reached it.
    audited: list[Path] = []
    monkeypatch.setattr(
        "vllm_fork.wheel.verify._audit", lambda _c, wheel, _r, _t: audited.append(wheel)
    )
    argv = ["build", "--mode", "empty", "--build-python", str(fake_build_python(tmp_path))]
    assert main([*argv, "-o", str(dist), "--json"]) == 0
    # one command: bases.toml parsed once, the series read once, at most one fetcher
    assert (loads["pins"], loads["series"]) == (1, 1) and loads["fetchers"] <= 1
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    # the backend's warnings go to its log, not to the terminal
    assert "noisy backend warning" not in captured.err
    assert not [w for w in recwarn if "noisy backend warning" in str(w.message)]
    wheel = dist / "vllm-9.9.9+hardened.2-py3-none-any.whl"
    assert data == {
        "wheel": str(wheel),
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "version": "9.9.9+hardened.2",
        "base": "9.9.9",
        "series_digest": fork_repo.config.series("9.9.9").digest(),
        "mode": "empty",
        "device": "cuda",
    }
    assert [p.name for p in audited] == [wheel.name]  # verify ran on the hook's wheel
    assert wheel.name in [p.name for p in dist.iterdir()]
    assert not any(fork_repo.config.cache.work.iterdir())  # the build tree was removed


def test_build_runs_the_backend_through_the_runner_it_is_given(
    fork_repo: ForkRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build() takes the backend runner as a parameter (as pypa/build takes its
    runner): the runner gets the plan (tree, environment, output directory) and
    the log path, and the wheel it names is verified and moved to the output
    directory; no backend is planted in the tree."""
    import os

    make_series(fork_repo, tmp_path, python_patch)
    audited: list[Path] = []
    monkeypatch.setattr(
        "vllm_fork.wheel.verify._audit", lambda _c, wheel, _r, _t: audited.append(wheel)
    )
    backend: dict = {}
    exec(FAKE_BACKEND, backend)  # the wheel writer of the in-tree backend above
    calls: list[tuple[Path, str, Path]] = []

    def runner(plan, log_path: Path) -> str:
        env = plan.environ(os.environ)
        calls.append((plan.tree, env["VLLM_VERSION_OVERRIDE"], log_path))
        with monkeypatch.context() as m:
            m.chdir(plan.tree)
            for key, value in env.items():
                m.setenv(key, value)
            return backend["build_wheel"](str(plan.out_dir))

    dist = tmp_path / "dist"
    req = BuildRequest(mode="empty", build_python=str(fake_build_python(tmp_path)), out_dir=dist)
    with pytest.warns(UserWarning, match="noisy backend warning"):
        result = build(fork_repo.config, req, runner=runner)
    [(tree, version, log_path)] = calls
    assert version == result.version == "9.9.9+hardened.1"
    assert log_path.name == "build.log" and tree.name == "src"
    assert result.wheel == dist / f"vllm-{version}-py3-none-any.whl" and result.wheel.is_file()
    assert [p.name for p in audited] == [result.wheel.name]  # verify ran on the runner's wheel
    assert result.record["version"] == version and result.environment["python"] == "3.11"
    assert set(result.findings) and not list(dist.glob("*.cdx.json"))  # no release files yet
    assert not any(fork_repo.config.cache.work.iterdir())  # the build tree was removed


def test_the_published_wheel_gets_the_mode_of_a_new_file(tmp_path: Path) -> None:
    """The wheel is readable like the SBOM and provenance beside it (0644
    under umask 022), not 0600 like the temporary file it was copied through."""
    import os

    from vllm_fork.wheel.builder import _publish

    built = tmp_path / "build" / "vllm-1.0.0+hardened.1-py3-none-any.whl"
    built.parent.mkdir()
    built.write_bytes(b"wheel")
    out = tmp_path / "dist"
    out.mkdir()
    old = os.umask(0o022)
    try:
        target = _publish(built, out)
    finally:
        os.umask(old)
    assert target.read_bytes() == b"wheel"
    assert target.stat().st_mode & 0o777 == 0o644
