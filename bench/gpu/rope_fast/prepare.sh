#!/usr/bin/env bash
# Stage what run.sh needs on the GPU machine (which has no network) into an
# ignored folder, by default .device/rope-fast of this repository:
#   bench/{rope_fast,rope_cache_dtype}/   the benchmark scripts
#   src/<variant>/csrc/                  pos_encoding_kernels.cu + 2 headers
#   tests/fork-0.21.0/                   the fork tree's rotary kernel tests
#                                        (and its csrc, for the hipify test)
#   flashinfer/include/flashinfer/       pos_enc.cuh and what it includes
#                                        (fastdiv.cuh left out, see binding),
#                                        of FlashInfer 0.7.4, the peer
#   flashinfer-0.7.2/include/flashinfer/ the same of 0.7.2, with
#                                        FI_SECOND_WHEEL (a second column)
#
# Usage: prepare.sh UPSTREAM_0.21.0_TREE FORK_0.21.0_TREE FLASHINFER_WHEEL [DEST]
#                   [FORK_0.20.0_TREE]
# The trees are vLLM source trees (an unpacked sdist, a materialized fork
# work tree). FLASHINFER_WHEEL is flashinfer-python at the pinned version
# below (FI_SECOND_WHEEL, if set, the older pinned one), checked against its
# sha256; nothing of it is committed.
set -euo pipefail

FI_VERSION=0.7.4
FI_SHA256=a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32
FI_SECOND_VERSION=0.7.2
FI_SECOND_SHA256=770550a0aa92b2f10e6c9a1f048dd43713f0f3bb6a12710186fcf8e4e9c99bd8

if [ $# -lt 3 ]; then
  sed -n '2,18p' "$0" >&2
  exit 2
fi
upstream=$1 fork=$2 wheel=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel)
dest=${4:-$root/.device/rope-fast}
fork_0200=${5:-}

for tree in "$upstream" "$fork"; do
  if [ ! -f "$tree/csrc/pos_encoding_kernels.cu" ]; then
    echo "error: $tree is not a vLLM source tree (no csrc/pos_encoding_kernels.cu)" >&2
    exit 2
  fi
done
check_wheel() {  # wheel version sha256
  case $(basename "$1") in
    flashinfer_python-$2-*.whl) ;;
    *) echo "error: $1 is not flashinfer_python $2" >&2; exit 2 ;;
  esac
  local sum
  sum=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$sum" != "$3" ]; then
    echo "error: $1 sha256 $sum, expected $3" >&2
    exit 2
  fi
}
check_wheel "$wheel" "$FI_VERSION" "$FI_SHA256"
if [ -n "${FI_SECOND_WHEEL:-}" ]; then
  check_wheel "$FI_SECOND_WHEEL" "$FI_SECOND_VERSION" "$FI_SECOND_SHA256"
fi

rm -rf "$dest/src" "$dest/tests" "$dest/flashinfer" "$dest/flashinfer-$FI_SECOND_VERSION" \
  "$dest/bench"
for pair in "upstream-0.21.0:$upstream" "fork-0.21.0:$fork"; do
  name=${pair%%:*} tree=${pair#*:}
  mkdir -p "$dest/src/$name/csrc"
  for f in pos_encoding_kernels.cu cuda_compat.h dispatch_utils.h; do
    cp "$tree/csrc/$f" "$dest/src/$name/csrc/"
  done
done
# The tests keep the tree's layout (the hipify test reads csrc/ from it).
t=$dest/tests/fork-0.21.0
mkdir -p "$t/tests/kernels/core" "$t/csrc"
for f in test_rotary_embedding_cache_dtype.py test_rotary_embedding_fast.py \
  test_rotary_embedding_rocm_portable.py test_rotary_embedding_op_check.py; do
  # The op check tests (issue 30) are in trees that carry them.
  [ -f "$fork/tests/kernels/core/$f" ] || continue
  cp "$fork/tests/kernels/core/$f" "$t/tests/kernels/core/"
done
cp "$fork"/csrc/{pos_encoding_kernels.cu,cuda_compat.h,dispatch_utils.h} "$t/csrc/"
# A second fork base (0.20.0, cache dtype bounded): its build and tests.
if [ -n "$fork_0200" ]; then
  mkdir -p "$dest/src/fork-0.20.0/csrc" "$dest/tests/fork-0.20.0/tests/kernels/core"
  for f in pos_encoding_kernels.cu cuda_compat.h dispatch_utils.h; do
    cp "$fork_0200/csrc/$f" "$dest/src/fork-0.20.0/csrc/"
  done
  cp -r "$dest/src/fork-0.20.0/csrc" "$dest/tests/fork-0.20.0/"
  for f in test_rotary_embedding_cache_dtype.py test_rotary_embedding_fast.py \
    test_rotary_embedding_rocm_portable.py test_rotary_embedding_op_check.py; do
    [ -f "$fork_0200/tests/kernels/core/$f" ] || continue
    cp "$fork_0200/tests/kernels/core/$f" "$dest/tests/fork-0.20.0/tests/kernels/core/"
  done
fi
mkdir -p "$dest/bench"
cp -r "$here" "$root/bench/gpu/rope_cache_dtype" "$dest/bench/"

# pos_enc.cuh and the headers it includes, transitively, from a wheel.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stage_headers() {  # wheel dest_include
  local inc=$2/flashinfer src=$tmp/$(basename "$1")/flashinfer/data/include/flashinfer
  mkdir -p "$inc"
  unzip -q "$1" 'flashinfer/data/include/flashinfer/*' -d "$tmp/$(basename "$1")"
  local todo=(pos_enc.cuh) f dep
  while [ ${#todo[@]} -gt 0 ]; do
    f=${todo[0]} todo=("${todo[@]:1}")
    [ -f "$inc/$f" ] && continue
    cp "$src/$f" "$inc/$f"
    for dep in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$src/$f"); do
      # fastdiv.cuh needs a newer CCCL than CUDA 13.0; the binding stands in.
      [ "$dep" = fastdiv.cuh ] && continue
      todo+=("$dep")
    done
  done
  ls "$inc"
}
stage_headers "$wheel" "$dest/flashinfer/include"
if [ -n "${FI_SECOND_WHEEL:-}" ]; then
  stage_headers "$FI_SECOND_WHEEL" "$dest/flashinfer-$FI_SECOND_VERSION/include"
fi

if ! git -C "$(dirname "$dest")" check-ignore -q "$dest/src"; then
  echo "warning: $dest is not ignored by git" >&2
fi
du -sh "$dest"
