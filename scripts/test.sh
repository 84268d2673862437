#!/usr/bin/env bash
# Lint and test the tool (ruff check, ruff format --check, pytest), then run
# the series tests of the default base in a materialized tree (scripts/test-tree.sh).
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not network").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
ensure_venv dev

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

# The fork's own tests inside a materialized tree of the default base
# (skip with VLLM_FORK_TREE_TESTS=0, e.g. while iterating on the tool).
if [[ $# -eq 0 && "${VLLM_FORK_TREE_TESTS:-1}" != 0 ]]; then
    scripts/test-tree.sh
fi
