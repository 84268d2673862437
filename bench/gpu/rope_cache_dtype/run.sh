#!/usr/bin/env bash
# Build three versions of vLLM's csrc/pos_encoding_kernels.cu as torch
# extensions (fork 0.20.0, pristine 0.20.0, pristine 0.21.0; sm_90), check and
# time them (bench.py), then run the fork trees' rotary cache tests against
# the builds. Run from the repository root on a machine with an sm_90 GPU,
# after prepare.sh staged the sources.
#
# Usage: bench/gpu/rope_cache_dtype/run.sh [DATA_DIR] [OUT_DIR]
#   DATA_DIR  what prepare.sh staged (default .device/rope)
#   OUT_DIR   results (default ./rope-cache-dtype-results)
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
data=$(realpath "${1:-.device/rope}")
out=${2:-rope-cache-dtype-results}
build=${ROPE_BUILD_DIR:-/tmp/rope-cache-dtype-build}
mkdir -p "$out" "$build"
if [ ! -d "$data/src" ]; then
  echo "error: $data/src missing; run prepare.sh first" >&2
  exit 2
fi

export TORCH_CUDA_ARCH_LIST=9.0
export MAX_JOBS=${MAX_JOBS:-8}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -n 1
  echo "ninja $(ninja --version)"
} 2>&1 | tee "$out/env.txt"

python3 "$here/bench.py" --src "$data/src" --build "$build" --out "$out" \
  --bandwidth "${ROPE_BANDWIDTH:-3.0e12}" \
  2>&1 | tee "$out/bench.log"
status=${PIPESTATUS[0]}

# Fork tests against a build: the fork 0.20.0 tests must pass on the fork
# kernel and fail on pristine 0.20.0; the 0.21.0 tests pin upstream 0.21.0.
for spec in fork-0.20.0:fork-0.20.0 pristine-0.20.0:fork-0.20.0 \
  pristine-0.21.0:fork-0.21.0; do
  variant=${spec%%:*} tests=${spec#*:}
  echo "## tests of $tests against the $variant build"
  ROPE_BENCH_VARIANT=$variant ROPE_BENCH_SRC=$data/src ROPE_BENCH_BUILD=$build \
    python3 -m pytest -q -p no:cacheprovider --noconftest -p rope_pytest_plugin \
    -rfE "$data/tests/$tests" >"$out/pytest-$variant.log" 2>&1
  echo "pytest exit $?"
  grep -E "^(FAILED|ERROR)" "$out/pytest-$variant.log" | cut -c1-160 | head -n 12
  tail -n 1 "$out/pytest-$variant.log"
done
exit "$status"
