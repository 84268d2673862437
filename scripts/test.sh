#!/usr/bin/env bash
# Lint and test the tool (ruff check, ruff format --check, pytest), then run
# the series tests of the default base in a materialized tree (scripts/test-tree.sh).
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not network").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
ensure_venv dev

# The extra base of commit $1 (empty when there is none).
ci_extra_base() {
    .venv/bin/python -c 'import sys
from vllm_fork.sources.workspace import load_config
from vllm_fork.release.check import ci_base
print(ci_base(load_config(), sys.argv[1]) or "")' "$1"
}

.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The end-to-end precompiled build of the default base (twice, compared) runs
# here too: it needs the index or a warm cache; VLLM_FORK_E2E_BUILD=0 skips it.
# So does the deploy end to end (tests/test_deploy_e2e.py): the default wheel,
# reused from <cache>/work/e2e-dist while it verifies, published to a local
# pypiserver, pip-installed from it with --no-deps and checked by smoke --installed.
# Installing the wheel with all its dependencies (`vllm-fork smoke`, about
# 8 GB) runs only with VLLM_FORK_E2E_SMOKE=1.
export VLLM_FORK_E2E_BUILD="${VLLM_FORK_E2E_BUILD:-1}"
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"

# The fork's own tests inside a materialized tree of the default base, then
# of one more base picked from the commit hash among the other bases with a
# series (fork tests + prove-fail, no wheel build), so successive commits
# exercise every base; VLLM_FORK_EXTRA_BASE=V picks it, =none skips it.
# Skip both with VLLM_FORK_TREE_TESTS=0, e.g. while iterating on the tool.
# The whole release check of every base is `vllm-fork release-check` (README).
if [[ $# -eq 0 && "${VLLM_FORK_TREE_TESTS:-1}" != 0 ]]; then
    scripts/test-tree.sh
    extra="${VLLM_FORK_EXTRA_BASE:-$(ci_extra_base "$(git rev-parse HEAD 2>/dev/null || echo 0)")}"
    if [[ -n "$extra" && "$extra" != none ]]; then
        echo "extra base for this commit: $extra"
        scripts/test-tree.sh "$extra"
    fi
fi
