#!/usr/bin/env bash
# Tests only, after prepare.sh (with a 0.20.0 tree): the fork 0.21.0 and
# 0.20.0 builds, their kernel tests (op checks included), and the op check
# tests against upstream 0.21.0 (must fail).
# Usage: tests_only.sh [DATA_DIR] [OUT_DIR]   (logs2.tgz is written to OUT_DIR)
set -u
data=$(realpath "${1:-.device/rope-fast}")
OUT=${2:-rope-fast-results}
mkdir -p "$OUT"
b=$data/bench; o=/tmp/rope-out2; mkdir -p $o
export PYTHONPATH=$b/rope_fast:$b/rope_cache_dtype ROPE_BENCH_SRC=$data/src ROPE_BENCH_BUILD=/tmp/rope-fast-build TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
python3 -c "import rope_ext; from pathlib import Path; rope_ext.build_all(('fork-0.21.0','fork-0.20.0','upstream-0.21.0'), Path('$data/src'), Path('/tmp/rope-fast-build'))" || exit 1
for v in fork-0.21.0 fork-0.20.0; do
  echo "## $v tests against the $v build"
  ROPE_BENCH_VARIANT=$v timeout 300 python3 -m pytest -q -p no:cacheprovider --noconftest -p rope_pytest_plugin -rfE $data/tests/$v/tests/kernels/core > $o/pytest-$v.log 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)" $o/pytest-$v.log | head; tail -n 1 $o/pytest-$v.log
  echo "## $v op check tests, verbose"
  ROPE_BENCH_VARIANT=$v timeout 120 python3 -m pytest -v -p no:cacheprovider --noconftest -p rope_pytest_plugin $data/tests/$v/tests/kernels/core/test_rotary_embedding_op_check.py 2>&1 | grep -E "PASSED|FAILED|ERROR|passed|failed" | sed 's/.*:://' | tee $o/op-check-$v.log
done
echo "## op check tests against the upstream-0.21.0 build (must fail)"
ROPE_BENCH_VARIANT=upstream-0.21.0 timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest -p rope_pytest_plugin $data/tests/fork-0.21.0/tests/kernels/core/test_rotary_embedding_op_check.py > $o/op-check-upstream.log 2>&1
echo "pytest exit $?"; tail -n 1 $o/op-check-upstream.log
tar czf "$OUT/logs2.tgz" -C $o .
