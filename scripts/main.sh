#!/usr/bin/env bash
# Set up the tool in .venv and materialize the default base with its patch series
# into DIR (default: work/vllm-<default base>), then print the status per change.
# Usage: scripts/main.sh [DIR]      (BASE=0.20.0 scripts/main.sh to pick another base)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
ensure_venv ""

base="${BASE:-$(.venv/bin/python -c 'from vllm_fork.pins import load_pins; print(load_pins(__import__("pathlib").Path("bases.toml")).get(None).version)')}"
dir="${1:-work/vllm-$base}"

if [[ -d "$dir" && -n "$(ls -A "$dir")" ]]; then
    have="$(git -C "$dir" config --get vllm-fork.base 2>/dev/null || true)"
    if [[ "$have" != "$base" ]]; then
        echo "error: $dir exists and is not a materialized work tree of $base" >&2
        exit 1
    fi
    echo "$dir already holds vLLM $base; leaving it as it is"
else
    .venv/bin/vllm-fork materialize --base "$base" "$dir"
fi
.venv/bin/vllm-fork status --base "$base"
