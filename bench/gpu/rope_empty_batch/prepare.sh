#!/usr/bin/env bash
# Stage what run.sh needs on the GPU machine (which has no network) into an
# ignored folder, by default .device/rope-empty of this repository:
#   src/upstream-0.21.0/csrc/   upstream's pos_encoding_kernels.cu + 2 headers
#   fork/vllm/_custom_ops.py    the fork tree's op wrapper (the guard)
#   bench/{rope_empty_batch,rope_fast,rope_cache_dtype}/   the scripts
#
# Usage: prepare.sh UPSTREAM_0.21.0_TREE FORK_TREE [DEST]
# UPSTREAM_0.21.0_TREE is pristine vLLM 0.21.0 (an unpacked sdist, or a
# materialized tree at upstream/0.21.0); FORK_TREE a materialized fork work
# tree (e.g. of 0.21.0).
set -euo pipefail

if [ $# -lt 2 ]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
upstream=$1 fork=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
dest=${3:-$root/.device/rope-empty}

if [ ! -f "$upstream/csrc/pos_encoding_kernels.cu" ]; then
  echo "error: $upstream is not a vLLM source tree (no csrc/pos_encoding_kernels.cu)" >&2
  exit 2
fi
if ! grep -q "positions.numel() == 0" "$fork/vllm/_custom_ops.py" 2>/dev/null; then
  echo "error: $fork/vllm/_custom_ops.py has no empty-batch guard (not a fork tree?)" >&2
  exit 2
fi

rm -rf "$dest/src" "$dest/fork" "$dest/bench"
mkdir -p "$dest/src/upstream-0.21.0/csrc" "$dest/fork/vllm" "$dest/bench"
for f in pos_encoding_kernels.cu cuda_compat.h dispatch_utils.h; do
  cp "$upstream/csrc/$f" "$dest/src/upstream-0.21.0/csrc/"
done
cp "$fork/vllm/_custom_ops.py" "$dest/fork/vllm/"
git -C "$fork" log -1 --format='fork tree %H %s' >"$dest/fork/SOURCE" 2>/dev/null ||
  echo "fork tree $fork" >"$dest/fork/SOURCE"
for d in rope_empty_batch rope_fast rope_cache_dtype; do
  cp -r "$root/bench/gpu/$d" "$dest/bench/"
done
find "$dest/bench" -name __pycache__ -prune -exec rm -rf {} +

if ! git -C "$root" check-ignore -q "$dest/src"; then
  echo "warning: $dest is not ignored by git" >&2
fi
du -sh "$dest"
