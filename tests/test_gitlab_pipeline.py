"""The GitLab pipeline run for real: the `.gitlab-ci.yml` that `vllm-fork ci-workflows`
generates, on a synthetic fork repository, executed by gitlab-ci-local (npm package,
pinned below) with its shell executor, each job in a copy of the repository of its own
(--shell-isolation), offline: the synthetic releases come from a local index on
127.0.0.1, the trees' tests run with this interpreter (VLLM_FORK_TREE_PYTHON).

The repository holds a `.venv` that stands for the tool installed by the job's
`before_script` (scripts/venv.sh finds its stamp and installs nothing; the install
itself is tested by tests/test_installer.py and the test command's own start).

Skipped, with the reason, where node/npm, rsync (gitlab-ci-local copies the
repository with it) or the npm registry cannot be had."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_fork.release import workflows

from .rebase_support import Fork, git, make_fork
from .test_release import BAD, BARE, GOOD, PKG, author, change_message
from .test_release_shards import GOOD2, VERSIONS, good_patch, markdown_without_times
from .test_release_shards import without_timings as _without_timings

ROOT = Path(__file__).resolve().parents[1]
# the newest release that runs on the Node.js 20 of Debian 12 (4.74.0 needs Node 22)
GITLAB_CI_LOCAL = "4.73.0"
REMOTE = "https://gitlab.example.invalid/fork/vllm-fork.git"
NO_WHEEL = "VLLM_FORK_CHECK_ARGS=--no-wheel"
# a pipeline started by hand (a push runs only when an input changed, tested below)
WEB = "CI_PIPELINE_SOURCE=web"
# the synthetic package without vllm/__init__.py (a namespace package imports the
# same): no vLLM tree to the tool, so the trees' tests run without the ROCm
# simulation (it needs torch), as the in-process tests' patched pytest_args do
PLAIN = {k: v for k, v in PKG.items() if k != "vllm/__init__.py"}

# the whole pipeline is a few minutes of gitlab-ci-local's and the jobs' start-ups
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def gitlab_ci_local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gitlab-ci-local@GITLAB_CI_LOCAL, installed from the npm registry once a session."""
    for tool, why in (
        ("node", "gitlab-ci-local is a Node.js program"),
        ("npm", "gitlab-ci-local is installed with npm"),
        ("rsync", "gitlab-ci-local copies the repository for each job with rsync"),
        ("git", "the pipeline runs in a git repository"),
    ):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed ({why})")
    prefix = tmp_path_factory.mktemp("gitlab-ci-local")
    proc = subprocess.run(
        ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--silent"]
        + [f"gitlab-ci-local@{GITLAB_CI_LOCAL}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    binary = prefix / "node_modules" / ".bin" / "gitlab-ci-local"
    if proc.returncode != 0 or not binary.is_file():
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"gitlab-ci-local@{GITLAB_CI_LOCAL} cannot be installed: {last[0]}")
    return binary


@dataclass
class Pipeline:
    fork: Fork
    binary: Path
    env: dict[str, str]

    @property
    def root(self) -> Path:
        return self.fork.root

    def artifact(self, job: str, path: str) -> Path:
        """``path`` among the artifacts of ``job`` (a matrix job: any of its runs)."""
        found = sorted((self.root / ".gitlab-ci-local" / "artifacts").glob(f"{job}*/{path}"))
        assert len(found) == 1, (job, path, found)
        return found[0]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), "--no-color"]
        cmd += ["--force-shell-executor", "--shell-isolation", "--home", str(self.fork.tmp)]
        # each job's artifacts stay its own (not copied into the project, whence the
        # next job's copy would take them)
        cmd += ["--no-artifacts-to-source"]
        # the predefined variables the tests set on purpose: no warning
        cmd += ["--ignore-predefined-vars", "CI_PIPELINE_SOURCE,CI_SERVER_URL,CI_API_V4_URL"]
        proc = subprocess.run(
            [*cmd, *args], cwd=self.root, env=self.env, capture_output=True, text=True, timeout=900
        )
        print(f"$ gitlab-ci-local {' '.join(args)}\n{proc.stdout}{proc.stderr}")
        return proc


def results(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The jobs of the closing summary: name -> PASS, FAIL or WARN."""
    return {
        m.group(2).strip(): m.group(1)
        for m in re.finditer(r"^ (PASS|FAIL|WARN) +(.+?)\s*$", proc.stdout, re.MULTILINE)
    }


def commit_all(root: Path, message: str) -> None:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)


def make_pipeline(fork: Fork, binary: Path, index_url: str) -> Pipeline:
    """Make ``fork``'s repository a project with the generated pipeline."""
    root = fork.root
    (root / workflows.GITLAB_YML).write_text(workflows.gitlab_ci(workflows.ci_bases(fork.config)))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    for part in ("scripts", "sim"):  # the ROCm simulation: the trees' tests load it
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    # what the jobs write stays out of the copies gitlab-ci-local makes (it copies
    # the files git tracks); the .venv below is tracked
    (root / ".gitignore").write_text("/results/\n/report/\n/bot/\n/.cache/\n/.gitlab-ci-local/\n")
    # the tool as the before_script leaves it: .venv/bin and the stamp of the dev extras
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, args in (("python", ""), ("vllm-fork", " -m vllm_fork")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {sys.executable}{args} "$@"\n')
        (bin_dir / name).chmod(0o755)
    stamp = subprocess.run(
        ["bash", "-c", "source scripts/venv.sh && venv_stamp dev"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (root / ".venv" / ".vllm-fork-installed").write_text(stamp + "\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "remote", "add", "origin", REMOTE)
    commit_all(root, "the fork")
    # as pushed: origin/main is this commit (rules:changes compare with it)
    git(root, "update-ref", "refs/remotes/origin/main", "HEAD")
    git(root, "symbolic-ref", "refs/remotes/origin/HEAD", "refs/remotes/origin/main")
    # what the jobs inherit: no setting of this session's (the test's cache, pip's
    # files and mirrors), the local index, this interpreter for the trees' tests
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VLLM_FORK_", "PIP_", "UV_", "PYTEST_", "CI_", "GITLAB_"))
    }
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=index_url,
        VLLM_FORK_TREE_PYTHON=sys.executable,
    )
    return Pipeline(fork, binary, env)


@pytest.fixture
def four(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_index, gitlab_ci_local) -> Pipeline:
    """test_release_shards' four bases (GOOD, GOOD2 proven; BAD unproven; BARE no
    series), their sdists on the local index and nowhere else."""
    fork = make_fork(tmp_path, monkeypatch, {v: PLAIN for v in VERSIONS}, default=GOOD)
    good_patch(fork, GOOD)
    good_patch(fork, GOOD2)
    author(
        fork,
        BAD,
        {
            "vllm/layer.py": "def f(x):\n    return x  # patched\n",
            "tests/test_layer.py": "from vllm.layer import f\n\n\ndef test_f():\n"
            "    assert f(1) == 1\n",
        },
        change_message("[Misc] A test that cannot fail"),
    )
    local_index.publish(*sorted((tmp_path / "sdists").glob("*.tar.gz")))
    return make_pipeline(fork, gitlab_ci_local, local_index.url)


def test_the_release_pipeline_checks_each_base_merges_one_runs_report_keeps_its_cache(
    four: Pipeline, tmp_path: Path
) -> None:
    listed = four.run("--list-json", "--variable", WEB)
    assert listed.returncode == 0, listed.stderr
    names = [job["name"] for job in json.loads(listed.stdout[listed.stdout.index("[") :])]
    expected = [f"release-check: [{v}]" for v in VERSIONS] + ["release-report", "update-bot"]
    assert sorted(names) == sorted(expected)

    # synthetic bases pin no upstream wheel: the jobs check them without one
    proc = four.run("--variable", WEB, "--variable", NO_WHEEL)
    jobs = results(proc)
    assert proc.returncode != 0  # BAD and BARE fail, and the report with them
    assert jobs == {
        f"release-check: [{GOOD}]": "PASS",
        f"release-check: [{BAD}]": "FAIL",
        f"release-check: [{BARE}]": "FAIL",
        f"release-check: [{GOOD2}]": "PASS",
        "release-report": "FAIL",
    }
    merged = json.loads(four.artifact("release-report", "report/release-check.json").read_text())
    assert [r["base"] for r in merged["bases"]] == VERSIONS and merged["missing"] == []

    # one local run of the same commit: the same report, timings aside
    local = subprocess.run(
        [str(four.root / ".venv" / "bin" / "vllm-fork"), "release-check", "--no-wheel"]
        + ["--json", str(tmp_path / "one.json"), "--markdown", str(tmp_path / "one.md")],
        cwd=four.root,
        env={**four.env, "VLLM_FORK_CACHE_DIR": str(tmp_path / "local-cache")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert local.returncode == 1, local.stdout + local.stderr
    single = json.loads((tmp_path / "one.json").read_text())
    assert _without_timings(merged) == _without_timings(single)
    assert markdown_without_times(
        four.artifact("release-report", "report/release-check.md").read_text()
    ) == markdown_without_times((tmp_path / "one.md").read_text())

    # the cache the job kept holds its recorded check: the next run of the
    # unchanged base takes it (no check again)
    assert (
        json.loads(four.artifact("release-check", f"results/{GOOD}.json").read_text())["reused"]
        is False
    )
    again = four.run(f"release-check: [{GOOD}]", "--variable", WEB, "--variable", NO_WHEEL)
    assert results(again) == {f"release-check: [{GOOD}]": "PASS"}
    result = json.loads(four.artifact("release-check", f"results/{GOOD}.json").read_text())
    assert result["reused"] is True and result["state"]["steps"]["tests"]["passed"] == 1

    # a base whose job left no result (killed, timed out) is missing: named, failing
    four.artifact("release-check", f"results/{BARE}.json").unlink()
    report = four.run("release-report", "--variable", WEB)
    assert report.returncode != 0 and results(report) == {"release-report": "FAIL"}
    merged = json.loads(four.artifact("release-report", "report/release-check.json").read_text())
    assert merged["missing"] == [BARE]
    assert [r["base"] for r in merged["bases"]] == [GOOD, BAD, GOOD2]
    table = four.artifact("release-report", "report/release-check.md").read_text()
    assert f"- {BARE}: no result (missing)" in table


@pytest.mark.parametrize(
    ("changed", "runs"),
    [
        ("known-issues.toml", True),
        ("local-changes.toml", True),
        ("upstream-triage.toml", True),
        ("pyproject.toml", True),
        ("sim/vllm_rocm_sim/site/x.py", True),
        ("scripts/x.sh", True),
        ("docker/Dockerfile.x", True),
        ("series/2.0.0/series", True),
        ("docs/notes.md", False),
    ],
)
def test_a_push_to_main_runs_the_check_when_an_input_changed(
    gitlab_ci_local: Path, tmp_path: Path, changed: str, runs: bool
) -> None:
    """rules:changes of the workflow, evaluated by gitlab-ci-local against
    origin/main: a change to any input of a base's result starts the pipeline."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / workflows.GITLAB_YML).write_text(workflows.gitlab_ci(["2.0.0"]))
    git(root, "init", "-q", "-b", "main")
    git(root, "remote", "add", "origin", REMOTE)
    commit_all(root, "pipeline")
    git(root, "update-ref", "refs/remotes/origin/main", "HEAD")
    (root / changed).parent.mkdir(parents=True, exist_ok=True)
    (root / changed).write_text("changed\n")
    commit_all(root, f"change {changed}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CI_", "GITLAB_"))}
    proc = subprocess.run(
        [str(gitlab_ci_local), "--no-color", "--home", str(tmp_path), "--list-json"]
        + ["--no-json-schema-validation"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = json.loads(proc.stdout[proc.stdout.index("[") :])
    when = {job["name"]: job["when"] for job in listed}
    assert (when["release-check: [2.0.0]"] != "never") == runs, when


def test_the_scheduled_update_bot_opens_a_merge_request_with_the_watch(
    gitlab_ci_local: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_index
) -> None:
    """A schedule with VLLM_FORK_JOB=update runs the bot job alone: a synthetic new
    release on the index is pinned, the series rebased onto it and checked, and a
    merge request opened whose description is the review, the new base's release
    check and the upstream watch's untriaged candidates. GitLab's side is a bare
    repository (the push) and a local HTTP server (the merge-request API)."""
    import http.server
    import threading
    from urllib.parse import parse_qs

    from .rebase_support import sdist_bytes
    from .test_watch import PATCH_F1, RELEASES, TRIAGE_HEAD, V1, layer, make_aiter

    new = "1.0.1"
    fork = make_fork(tmp_path, monkeypatch, {V1: RELEASES[V1]}, default=V1)
    fork.write_series(V1, [PATCH_F1])
    (fork.root / "upstream-triage.toml").write_text(TRIAGE_HEAD)
    aiter, fix = make_aiter(tmp_path)
    # upstream's next release changes f4 only: the series applies as it is
    release = {**RELEASES[V1], "vllm/layer.py": layer({4: "x * 4"})}
    (tmp_path / "sdists" / f"vllm-{new}.tar.gz").write_bytes(sdist_bytes(new, release))
    local_index.publish(*sorted((tmp_path / "sdists").glob("*.tar.gz")))
    pipeline = make_pipeline(fork, gitlab_ci_local, local_index.url)

    server_root = tmp_path / "gitlab"
    subprocess.run(
        ["git", "init", "-q", "--bare", str(server_root / "fork" / "vllm-fork.git")], check=True
    )
    posts: list[tuple[str, dict[str, str], str]] = []

    class Api(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            posts.append((self.path, dict(self.headers), body))
            self.send_response(201)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pipeline.env["VLLM_FORK_AITER_REPO"] = str(aiter)
    try:
        proc = pipeline.run(
            *("--variable", "CI_PIPELINE_SOURCE=schedule", "--variable", "VLLM_FORK_JOB=update"),
            *("--variable", "VLLM_FORK_BOT_TOKEN=bot-secret"),
            *("--variable", f"CI_SERVER_URL=file://{server_root}"),
            *("--variable", f"CI_API_V4_URL=http://127.0.0.1:{server.server_address[1]}/api/v4"),
        )
    finally:
        server.shutdown()
        server.server_close()
    assert results(proc) == {"update-bot": "PASS"}, proc.stdout
    body = pipeline.artifact("update-bot", "bot/report/body.md").read_text()
    assert body.startswith("# ") and f"## Release check of {new}" in body
    assert "## Upstream watch" in body and f"aiter/{fix[:12]}" in body
    ((path, headers, form),) = posts
    assert path.endswith("/merge_requests") and headers["PRIVATE-TOKEN"] == "bot-secret"
    fields = {k: v[0] for k, v in parse_qs(form).items()}
    assert fields["source_branch"] == f"update/vllm-{new}" and fields["description"] == body
    pushed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", f"update/vllm-{new}"],
        cwd=server_root / "fork" / "vllm-fork.git",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "bases.toml" in pushed and any(p.startswith(f"series/{new}/") for p in pushed)
