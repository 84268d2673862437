#!/usr/bin/env bash
# Stage what run.sh needs on the GPU machine (which has no network) into an
# ignored folder of this repository, by default .device/rope:
#   src/<variant>/csrc/{pos_encoding_kernels.cu,cuda_compat.h,dispatch_utils.h}
#   tests/<tree>/test_rotary_embedding_cache_dtype.py
#
# Usage: prepare.sh FORK_0.20.0_TREE PRISTINE_0.20.0_TREE PRISTINE_0.21.0_TREE \
#                   FORK_0.21.0_TREE [DEST]
# Each *_TREE is a vLLM source tree (an unpacked sdist or a materialized
# fork work tree).
set -euo pipefail

if [ $# -lt 4 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
fork_0200=$1 base_0200=$2 base_0210=$3 fork_0210=$4
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
dest=${5:-$root/.device/rope}

for tree in "$fork_0200" "$base_0200" "$base_0210" "$fork_0210"; do
  if [ ! -f "$tree/csrc/pos_encoding_kernels.cu" ]; then
    echo "error: $tree is not a vLLM source tree (no csrc/pos_encoding_kernels.cu)" >&2
    exit 2
  fi
done
for tree in "$fork_0200" "$fork_0210"; do
  if [ ! -f "$tree/tests/kernels/core/test_rotary_embedding_cache_dtype.py" ]; then
    echo "error: $tree has no tests/kernels/core/test_rotary_embedding_cache_dtype.py" >&2
    exit 2
  fi
done

stage_src() {  # variant tree
  local out=$dest/src/$1/csrc
  mkdir -p "$out"
  for f in pos_encoding_kernels.cu cuda_compat.h dispatch_utils.h; do
    cp "$2/csrc/$f" "$out/$f"
  done
}

rm -rf "$dest/src" "$dest/tests"
stage_src fork-0.20.0 "$fork_0200"
stage_src pristine-0.20.0 "$base_0200"
stage_src pristine-0.21.0 "$base_0210"
for pair in "fork-0.20.0:$fork_0200" "fork-0.21.0:$fork_0210"; do
  name=${pair%%:*} tree=${pair#*:}
  mkdir -p "$dest/tests/$name"
  cp "$tree/tests/kernels/core/test_rotary_embedding_cache_dtype.py" "$dest/tests/$name/"
done

if ! git -C "$root" check-ignore -q "$dest/src"; then
  echo "warning: $dest is not ignored by git" >&2
fi
du -sh "$dest"
