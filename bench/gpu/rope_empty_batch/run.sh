#!/usr/bin/env bash
# On a machine with an sm_90 GPU, from the repository root, after
# prepare.sh: build upstream 0.21.0's rotary kernel as an extension and run
# demo.py (empty batch through the kernel and through the fork's wrapper,
# each in its own process; non-empty cases bit-identical).
#
# Usage: run.sh [DATA_DIR] [OUT_DIR]
#   DATA_DIR  what prepare.sh staged (default .device/rope-empty)
#   OUT_DIR   results (default ./rope-empty-batch-results)
set -uo pipefail

data=$(realpath "${1:-.device/rope-empty}")
out=${2:-rope-empty-batch-results}
build=${ROPE_BUILD_DIR:-/tmp/rope-empty-batch-build}
mkdir -p "$out" "$build"
if [ ! -f "$data/fork/vllm/_custom_ops.py" ]; then
  echo "error: $data/fork missing; run prepare.sh first" >&2
  exit 2
fi

export TORCH_CUDA_ARCH_LIST=9.0
export MAX_JOBS=${MAX_JOBS:-16}
export PYTHONUNBUFFERED=1

{
  nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -n 1
  cat "$data/fork/SOURCE"
} 2>&1 | tee "$out/env.txt"

python3 "$data/bench/rope_empty_batch/demo.py" --src "$data/src" --build "$build" \
  --fork-ops "$data/fork/vllm/_custom_ops.py" --out "$out" 2>&1 | tee "$out/demo.log"
exit "${PIPESTATUS[0]}"
