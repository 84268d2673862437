"""The CI files (GitHub Actions, GitLab CI) generated from bases.toml: no drift
from the generator, pinned actions, least privilege, no event data in shell
steps, and the linters (actionlint, zizmor, check-jsonschema's GitLab CI
schema, shellcheck) pass on them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_fork.cli.main import main
from vllm_fork.release import workflows
from vllm_fork.sources.pins import load_pins, save_pins
from vllm_fork.sources.workspace import load_config

ROOT = Path(__file__).resolve().parents[1]
GITHUB = [ROOT / workflows.RELEASE_CHECK_YML, ROOT / workflows.UPDATE_YML]
GITLAB = ROOT / workflows.GITLAB_YML
SCRIPTS = sorted((ROOT / "scripts" / "ci").glob("*.sh"))


def load_yaml(path: Path) -> dict:
    yaml = pytest.importorskip("ruamel.yaml", reason="ruamel.yaml comes with the dev extras")
    return yaml.YAML(typ="safe").load(path.read_text())


def test_the_committed_ci_files_are_the_generated_ones() -> None:
    drift = workflows.drift(load_config(root=ROOT))
    assert drift == [], "run `vllm-fork ci-workflows --write`:\n" + "\n".join(drift)


def test_a_changed_bases_toml_is_drift_until_written(tmp_path: Path, monkeypatch, capsys) -> None:
    """A copy of the repository where one more base is unsupported: --check
    fails naming it, --write brings the files back in line."""
    root = tmp_path / "repo"
    (root / "series").mkdir(parents=True)
    shutil.copy(ROOT / "bases.toml", root / "bases.toml")
    for rel in workflows.generate(load_config(root=ROOT)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    monkeypatch.setenv("VLLM_FORK_ROOT", str(root))
    assert main(["ci-workflows", "--check"]) == 0
    pins = load_pins(root / "bases.toml")
    gone = pins.versions()[0]
    pins.bases[gone] = replace(pins.bases[gone], supported=False)
    save_pins(root / "bases.toml", pins)
    capsys.readouterr()
    assert main(["ci-workflows", "--check"]) == 1
    out = capsys.readouterr().out
    assert f'-        base: ["{gone}", ' in out
    assert f'-      - BASE: ["{gone}", ' in out
    assert "vllm-fork ci-workflows --write" in out
    assert main(["ci-workflows", "--write"]) == 0
    assert main(["ci-workflows", "--check"]) == 0
    assert f'"{gone}"' not in (root / workflows.RELEASE_CHECK_YML).read_text()


def test_one_job_per_supported_base_and_a_merge_that_expects_them_all() -> None:
    config = load_config(root=ROOT)
    pins = load_pins(config.bases_file)
    supported = [v for v in pins.versions() if pins.bases[v].supported]
    assert supported
    github = load_yaml(GITHUB[0])
    assert github["jobs"]["base"]["strategy"]["matrix"]["base"] == supported
    assert github["jobs"]["base"]["strategy"]["fail-fast"] is False
    report = github["jobs"]["report"]
    assert report["needs"] == "base" and report["if"] == "${{ !cancelled() }}"
    merge = next(s["run"] for s in report["steps"] if "release-merge" in s.get("run", ""))
    assert merge.split("--bases ")[1].split("--json")[0].replace("\\", " ").split() == supported
    gitlab = load_yaml(GITLAB)
    assert gitlab["release-check"]["parallel"]["matrix"] == [{"BASE": supported}]
    assert f"--bases {' '.join(supported)}" in " ".join(gitlab["release-report"]["script"])
    lines = workflows.job_list(config)
    assert sum(": base " in line for line in lines) == len(supported)


def test_actions_are_pinned_by_commit_with_their_tag() -> None:
    for path in GITHUB:
        for line in path.read_text().splitlines():
            if "uses:" in line:
                assert re.search(r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+(\.\d+)*$", line), line


def test_tokens_are_read_only_but_in_the_pull_request_job() -> None:
    for path in GITHUB:
        data = load_yaml(path)
        assert data["permissions"] == {"contents": "read"}, path
        for name, job in data["jobs"].items():
            wanted = (
                {"contents": "write", "pull-requests": "write"}
                if (path.name, name) == ("update.yml", "pull-request")
                else None
            )
            assert job.get("permissions") == wanted, (path.name, name)
            for step in job["steps"]:
                if step.get("uses", "").startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False


def test_no_expression_is_expanded_in_a_shell_step() -> None:
    """Values from the event, the matrix or another job reach a script through
    ``env`` (zizmor's template-injection audit checks the same on its own)."""
    for path in GITHUB:
        for job in load_yaml(path)["jobs"].values():
            for step in job["steps"]:
                assert "${{" not in step.get("run", ""), (path.name, step)
    for name, job in load_yaml(GITLAB).items():
        if isinstance(job, dict) and "script" in job:
            assert "${{" not in " ".join(job["script"]), name


# --- the linters ------------------------------------------------------------------------


def tool(name: str) -> str:
    """The linter from this interpreter's environment or PATH; skip when missing."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.is_file() else shutil.which(name)
    if found is None:
        pytest.skip(
            f"{name} is not installed (it comes with the dev extras: pip install -e .[dev])"
        )
    return found


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    print(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return proc


def test_actionlint_passes_the_workflows() -> None:
    tool("shellcheck")  # actionlint runs it on every `run:` step
    proc = run(tool("actionlint"), "-no-color", "-pyflakes=", *map(str, GITHUB))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_passes_the_workflows() -> None:
    """Offline (no audit that asks GitHub), pedantic, anything from low severity up."""
    proc = run(
        tool("zizmor"),
        "--offline",
        "--persona=pedantic",
        "--min-severity=low",
        "--format=json",
        *map(str, GITHUB),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == []


def test_the_gitlab_file_passes_the_gitlab_ci_schema() -> None:
    proc = run(tool("check-jsonschema"), "--builtin-schema", "vendor.gitlab-ci", str(GITLAB))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_passes_the_bot_scripts() -> None:
    assert SCRIPTS
    proc = run(tool("shellcheck"), *map(str, SCRIPTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_linters_catch_what_they_are_here_for(tmp_path: Path) -> None:
    """Each linter fails on a workflow with the fault it is run for: event data in a
    shell step, an action pinned by tag, a GitLab job without a script."""
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    text = (ROOT / workflows.RELEASE_CHECK_YML).read_text()
    text = text.replace(workflows.CHECKOUT.uses(), "actions/checkout@v7")
    text = text.replace(
        'run: vllm-fork release-check --bases "$BASE"',
        "run: echo ${{ github.event.head_commit.message }}; vllm-fork release-check --bases "
        '"$BASE"',
    )
    bad.write_text(text)
    assert run(tool("actionlint"), "-no-color", "-pyflakes=", str(bad)).returncode != 0
    found = run(tool("zizmor"), "--offline", "--format=json", str(bad))
    audits = {f["ident"] for f in json.loads(found.stdout)}
    assert {"template-injection", "unpinned-uses"} <= audits
    gitlab = tmp_path / ".gitlab-ci.yml"
    gitlab.write_text("release-check:\n  stage: check\n  scripts: [true]\n")
    assert run(
        tool("check-jsonschema"), "--builtin-schema", "vendor.gitlab-ci", str(gitlab)
    ).returncode


# --- the bot script ---------------------------------------------------------------------

FAKE_TOOL = """\
#!/usr/bin/env bash
# vllm-fork as the bot sees it: update reports $FAKE_ONTO, release-check fails
set -euo pipefail
cmd="$1"; shift
json= md=
while (( $# )); do
    case "$1" in --json) json="$2"; shift ;; --markdown) md="$2"; shift ;; esac
    shift
done
if [[ "$cmd" == update ]]; then
    printf '{"status": "rebased", "onto": %s}\\n' "${FAKE_ONTO:-null}" > "$json"
    printf '# vllm-fork update: rebased\\n\\nthe review\\n' > "$md"
    [[ "${FAKE_ONTO:-null}" == null ]] || { mkdir -p series/9.9.9; echo x > series/9.9.9/series; }
    exit 0
fi
if [[ "$cmd" == watch ]]; then
    echo '{}' > "$json"
    echo "untriaged candidates:"
    echo "  aiter/0123456789ab"
    exit "${FAKE_WATCH:-0}"
fi
printf '# Release check\\n\\n| base | result |\\n| 9.9.9 | failed |\\n' > "$md"
echo '{}' > "$json"
exit 1
"""


def bot(
    tmp_path: Path, onto: str | None, watch: int = 0
) -> tuple[subprocess.CompletedProcess[str], Path]:
    repo = tmp_path / "repo"
    (repo / "series").mkdir(parents=True)
    (repo / "bases.toml").write_text("# pins\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm-fork").write_text(FAKE_TOOL)
    (bin_dir / "vllm-fork").chmod(0o755)
    out = tmp_path / "out"
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        VLLM_FORK_ROOT=str(repo),
        GITHUB_OUTPUT=str(tmp_path / "github-output"),
        FAKE_ONTO=json.dumps(onto),
        FAKE_WATCH=str(watch),
    )
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/ci/update-bot.sh"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, out


def test_the_bot_writes_the_pull_request_body_and_its_files(tmp_path: Path) -> None:
    proc, out = bot(tmp_path, "9.9.9")
    assert proc.returncode == 0, proc.stderr
    body = (out / "report" / "body.md").read_text()
    assert body.startswith("# vllm-fork update: rebased\n\nthe review\n")
    assert "## Release check of 9.9.9\n\n| base | result |\n| 9.9.9 | failed |\n" in body
    assert (out / "changes" / "series" / "9.9.9" / "series").is_file()
    assert (out / "changes" / "bases.toml").is_file()
    assert (tmp_path / "github-output").read_text() == "release=9.9.9\n"


def test_the_bot_puts_the_watch_candidates_in_the_body(tmp_path: Path) -> None:
    proc, out = bot(tmp_path, "9.9.9", watch=1)
    assert proc.returncode == 0, proc.stderr
    body = (out / "report" / "body.md").read_text()
    assert "## Upstream watch" in body and "aiter/0123456789ab" in body
    assert (out / "report" / "watch.json").is_file()


def test_the_bot_fails_the_daily_run_on_untriaged_candidates(tmp_path: Path) -> None:
    proc, out = bot(tmp_path, None, watch=1)
    assert proc.returncode == 1 and "aiter/0123456789ab" in proc.stdout
    assert not (out / "release").exists()
    proc, out = bot(tmp_path / "again", None, watch=3)
    assert proc.returncode == 3  # the tool could not run: its own exit code


def test_the_bot_does_nothing_without_a_new_release(tmp_path: Path) -> None:
    proc, out = bot(tmp_path, None)
    assert proc.returncode == 0 and "no release newer" in proc.stdout
    assert not (out / "release").exists() and not (out / "changes").exists()
    assert not (tmp_path / "github-output").exists()


def test_the_bot_refuses_a_release_name_that_is_not_a_version(tmp_path: Path) -> None:
    proc, out = bot(tmp_path, "1.0; rm -rf /")
    assert proc.returncode == 1 and "unexpected release name" in proc.stderr
    assert not (tmp_path / "github-output").exists()


def test_the_gitlab_half_pushes_the_branch_and_opens_the_merge_request(tmp_path: Path) -> None:
    """scripts/ci/gitlab-merge-request.sh against a bare repository (the push) and a
    local HTTP server standing in for GitLab's merge request API."""
    import http.server
    import threading

    proc, out = bot(tmp_path, "9.9.9")
    assert proc.returncode == 0, proc.stderr
    repo = tmp_path / "repo"
    ident = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@invalid",
    }
    for args in (["init", "-q", "-b", "main"], ["add", "bases.toml"], ["commit", "-qm", "pins"]):
        subprocess.run(["git", *args], cwd=repo, env={**os.environ, **ident}, check=True)
    (repo / "series" / "9.9.9").rename(tmp_path / "moved")  # the bot's copy is what counts
    server_root = tmp_path / "server"
    subprocess.run(["git", "init", "-q", "--bare", str(server_root / "g/p.git")], check=True)
    posts: list[tuple[str, dict[str, str], str]] = []

    class Api(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            posts.append((self.path, dict(self.headers), body))
            self.send_response(201 if len(posts) == 1 else 409)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(
        os.environ,
        VLLM_FORK_ROOT=str(repo),
        VLLM_FORK_BOT_TOKEN="secret-token",
        CI_SERVER_URL=f"file://{server_root}",
        CI_PROJECT_PATH="g/p",
        CI_API_V4_URL=f"http://127.0.0.1:{server.server_address[1]}/api/v4",
        CI_PROJECT_ID="7",
        CI_DEFAULT_BRANCH="main",
        GIT_CONFIG_GLOBAL=os.devnull,  # no user identity: the script names its own
    )
    script = ["bash", str(ROOT / "scripts/ci/gitlab-merge-request.sh"), str(out)]
    try:
        first = subprocess.run(script, env=env, capture_output=True, text=True, timeout=60)
        again = subprocess.run(script, env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert first.returncode == 0, first.stderr
    assert "opened the merge request for update/vllm-9.9.9" in first.stdout
    assert again.returncode == 0 and "open already" in again.stdout
    path, headers, body = posts[0]
    assert path == "/api/v4/projects/7/merge_requests"
    assert headers["PRIVATE-TOKEN"] == "secret-token"
    from urllib.parse import parse_qs

    form = {k: v[0] for k, v in parse_qs(body).items()}
    assert form["source_branch"] == "update/vllm-9.9.9" and form["target_branch"] == "main"
    assert form["description"] == (out / "report" / "body.md").read_text()
    files = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", "update/vllm-9.9.9"],
        cwd=server_root / "g/p.git",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert files == ["bases.toml", "series/9.9.9/series"]


def test_the_gitlab_half_does_nothing_without_a_new_release(tmp_path: Path) -> None:
    proc, out = bot(tmp_path, None)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/ci/gitlab-merge-request.sh"), str(out)],
        env=dict(os.environ, VLLM_FORK_ROOT=str(tmp_path / "repo")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "nothing new" in done.stdout
