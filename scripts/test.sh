#!/usr/bin/env bash
# The test command (what CI runs on every commit, .ci/run): ruff check,
# ruff format --check, mypy over src/ ([tool.mypy]), the tool's tests (pytest on
# every core, pytest-xdist;
# the layer contracts are tests/test_layers.py), and the series tests of the
# default base in a materialized tree (scripts/test-tree.sh: fork tests +
# prove-fail), which run alongside from the start (they share only the cache,
# which is locked) and print their output after pytest's.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not network"), and
# then the tree tests are left out. VLLM_FORK_TEST_JOBS: pytest's processes
# (default: one per core; 0 runs the tests in this process, one at a time).
#
# The long checks are not run here; `vllm-fork release-check` runs them
# (README, "What the test command runs"):
# - the tests marked `release` (the end-to-end precompiled build of the default
#   base, twice; the deploy and ROCm end to end; the hostile-wheel fuzz; ...)
#   are skipped here with that reason; release-check runs them with the default
#   base's check (step tool-tests: VLLM_FORK_RELEASE_TESTS=1 pytest -m release);
# - the series tests of the other bases: release-check runs them for every base.
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

# The fork's own tests inside a materialized tree of the default base. Skip it
# with VLLM_FORK_TREE_TESTS=0, e.g. while iterating on the tool. One more base
# on request: VLLM_FORK_EXTRA_BASE=V, or =auto for the one picked from the
# commit hash among the other bases with a series (successive commits then
# exercise every base).
tree_tests() {
    scripts/test-tree.sh
    local extra="${VLLM_FORK_EXTRA_BASE:-none}"
    if [[ "$extra" == auto ]]; then
        extra="$(ci_extra_base "$(git rev-parse HEAD 2>/dev/null || echo 0)")"
    fi
    if [[ -n "$extra" && "$extra" != none ]]; then
        echo "extra base: $extra"
        scripts/test-tree.sh "$extra"
    fi
}

tree_pid=""
if [[ $# -eq 0 && "${VLLM_FORK_TREE_TESTS:-1}" != 0 ]]; then
    tree_log="$(mktemp "${TMPDIR:-/tmp}/vllm-fork-tree-tests.XXXXXX")"
    # a process group of its own (set -m), ended with this script whichever way it ends
    set -m
    tree_tests > "$tree_log" 2>&1 &
    tree_pid=$!
    set +m
    trap 'kill -- -"$tree_pid" 2>/dev/null || true; rm -f "$tree_log"' EXIT
fi

status=0
.venv/bin/ruff check . || status=$?
.venv/bin/ruff format --check . || status=$?
.venv/bin/mypy || status=$?
jobs="${VLLM_FORK_TEST_JOBS:-auto}"
xdist=(-n "$jobs" --dist worksteal)
[[ "$jobs" == 0 ]] && xdist=(-p no:xdist)
.venv/bin/python -m pytest -q -p no:cacheprovider -rs "${xdist[@]}" "$@" || status=$?

if [[ -n "$tree_pid" ]]; then
    tree_status=0
    wait "$tree_pid" || tree_status=$?
    echo "--- the tree tests (scripts/test-tree.sh), run alongside:"
    cat "$tree_log"
    if (( tree_status != 0 )); then
        echo "the tree tests failed (exit $tree_status)"
        status=$tree_status
    fi
fi
exit "$status"
