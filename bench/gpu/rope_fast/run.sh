#!/usr/bin/env bash
# On a machine with an sm_90 GPU, from the repository root, after
# prepare.sh: build upstream's, the fork's and FlashInfer's RoPE kernels,
# check and time them (bench.py), time the launch-bound rows round after
# round (ROPE_BENCH_ROUNDS, default 9; ROPE_SKIP_SMALL=1 leaves them out),
# run the fork tree's rotary kernel tests against the fork build and
# upstream's (ROPE_SKIP_TESTS=1 leaves them out), and the hipify check.
#
# Usage: run.sh [DATA_DIR] [OUT_DIR]
#   DATA_DIR  what prepare.sh staged (default .device/rope-fast)
#   OUT_DIR   results (default ./rope-fast-results)
set -uo pipefail

data=$(realpath "${1:-.device/rope-fast}")
out=${2:-rope-fast-results}
bench=$data/bench/rope_fast
build=${ROPE_BUILD_DIR:-/tmp/rope-fast-build}
mkdir -p "$out" "$build"
if [ ! -d "$data/src" ]; then
  echo "error: $data/src missing; run prepare.sh first" >&2
  exit 2
fi

export TORCH_CUDA_ARCH_LIST=9.0
export MAX_JOBS=${MAX_JOBS:-16}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$bench:$data/bench/rope_cache_dtype${PYTHONPATH:+:$PYTHONPATH}

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -n 1
} 2>&1 | tee "$out/env.txt"

fi_args=(--flashinfer-include "$data/flashinfer/include")
if [ -d "$data/flashinfer-0.7.2/include" ]; then
  fi_args+=(--flashinfer-include-2 "$data/flashinfer-0.7.2/include")
fi
python3 "$bench/bench.py" --src "$data/src" --build "$build" --out "$out" \
  "${fi_args[@]}" 2>&1 | tee "$out/bench.log"
status=${PIPESTATUS[0]}
if [ -z "${ROPE_SKIP_SMALL:-}" ]; then
  echo "## the launch-bound rows, ${ROPE_BENCH_ROUNDS:-9} rounds"
  ROPE_BENCH_ROWS=small python3 "$bench/bench.py" --src "$data/src" --build "$build" \
    --out "$out" "${fi_args[@]}" 2>&1 | tee "$out/small.log"
fi
if [ -n "${ROPE_SKIP_TESTS:-}" ]; then
  exit "$status"
fi

# The fork tree's tests against the fork build (all must pass) and
# upstream's: all but the empty batch, then the empty batch alone (it kills
# that process with SIGFPE on upstream's kernel).
pytest_run() {  # log variant args...
  local log=$1 variant=$2
  shift 2
  ROPE_BENCH_VARIANT=$variant ROPE_BENCH_SRC=$data/src ROPE_BENCH_BUILD=$build \
    timeout 300 python3 -m pytest -q -p no:cacheprovider --noconftest \
    -p rope_pytest_plugin -rfE "$@" >"$out/$log" 2>&1
  echo "pytest exit $?"
  grep -E "^(FAILED|ERROR)" "$out/$log" | cut -c1-160 | head -n 12
  tail -n 1 "$out/$log"
}
tests=$data/tests/fork-0.21.0/tests/kernels/core
echo "## fork-0.21.0 tests against the fork-0.21.0 build"
pytest_run pytest-fork.log fork-0.21.0 "$tests"
if [ -z "${ROPE_SKIP_UPSTREAM_TESTS:-}" ]; then
  echo "## the same tests but the empty batch and the op checks against the upstream-0.21.0 build"
  pytest_run pytest-upstream.log upstream-0.21.0 -k "not empty_batch" \
    --ignore "$tests/test_rotary_embedding_op_check.py" "$tests"
  echo "## the empty-batch test against the upstream-0.21.0 build"
  pytest_run pytest-upstream-empty.log upstream-0.21.0 -k empty_batch "$tests" 2>&1 |
    grep -v "^Extension modules"
fi
# The op's own input checks (issue 30): upstream's op launches on a host
# cache and loses the CUDA context, so these must fail there.
if [ -f "$tests/test_rotary_embedding_op_check.py" ]; then
  echo "## the op check tests against the upstream-0.21.0 build (must fail)"
  pytest_run pytest-upstream-op-check.log upstream-0.21.0 \
    "$tests/test_rotary_embedding_op_check.py"
fi
if [ -d "$data/src/fork-0.20.0" ]; then
  echo "## fork-0.20.0 tests against the fork-0.20.0 build"
  pytest_run pytest-fork-0.20.0.log fork-0.20.0 \
    "$data/tests/fork-0.20.0/tests/kernels/core"
fi
exit "$status"
