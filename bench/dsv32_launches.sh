#!/usr/bin/env bash
# Launches per simulated DeepSeek-V3.2 decode step (casts, fills, metadata),
# base vs fork, under the V1 and the V2 model runner, with and without async
# speculative decoding, on CPU through the fork's ROCm simulation (sim/, put on
# PYTHONPATH for both).
#   base = upstream as released; fork = the whole series.
# The benchmark script comes from the series; it is copied into the base tree.
# Usage: bench/dsv32_launches.sh [DIR]   (DIR: a materialized default-base tree;
#                                         made at work/vllm-<default> if absent)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
source scripts/tree-venv.sh
ensure_venv ""

base="$(default_base)"
dir="${1:-work/vllm-$base}"
[[ -d "$dir" ]] || .venv/bin/vllm-fork materialize --base "$base" "$dir"
dir="$(cd "$dir" && pwd)"
ensure_tree_venv "$dir" .venv-tree
python="$PWD/.venv-tree/bin/python"
bench="benchmarks/kernels/benchmark_dsv32_decode_launches.py"
[[ -f "$dir/$bench" ]] || { echo "error: $dir has no $bench (not in this series)" >&2; exit 1; }

tag="upstream/$(git -C "$dir" config --get vllm-fork.base)"
sim="$PWD/sim"

scratch="$(mktemp -d)"
cleanup() { git -C "$dir" worktree remove --force "$scratch/base" 2>/dev/null || true; rm -rf "$scratch"; }
trap cleanup EXIT
git -C "$dir" worktree add -q --detach "$scratch/base" "$tag"
cp "$dir/$bench" "$scratch/base/$bench"

# bias, model runner, draft tokens per request (async speculative decoding)
runs=(
    "bf16-exact v1 0"
    "bf16-exact v2 0"
    "collapsing v1 0"
    "bf16-exact v1 1"
    "bf16-exact v2 1"
)
for run in "${runs[@]}"; do
    read -r bias runner spec <<<"$run"
    for side in base fork; do
        tree="$dir"; [[ "$side" == base ]] && tree="$scratch/base"
        echo "## $side ($bias bias, $runner runner, $spec draft tokens)"
        (cd "$tree" && VLLM_LOGGING_LEVEL=ERROR PYTHONPATH="$tree:$sim" "$python" "$bench" \
            --bias "$bias" --runner "$runner" --spec-tokens "$spec" 2>/dev/null)
        echo
    done
done
