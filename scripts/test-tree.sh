#!/usr/bin/env bash
# Materialize a base with its series into a fresh work tree, run the series'
# own tests in it on CPU (ROCm paths through the fork's ROCm simulation), and
# prove every change/hardening patch's tests fail without that patch.
# Usage: scripts/test-tree.sh [BASE]          (default: the default base)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
source scripts/tree-venv.sh
ensure_venv ""

base="${1:-$(default_base)}"
dir="work/test-vllm-$base"
if [[ -e "$dir" ]]; then
    # Only ever remove a tree this script made before.
    if [[ "$(git -C "$dir" config --get vllm-fork.base 2>/dev/null || true)" != "$base" ]]; then
        echo "error: $dir exists and is not a work tree of $base made by this script" >&2
        exit 1
    fi
    rm -rf "$dir"
fi
# Every base with a series is tested here (CI picks one per commit), also those
# bases.toml does not mark supported yet.
.venv/bin/vllm-fork materialize --allow-unsupported --base "$base" "$dir"
python="$(tree_python "$dir")"
.venv/bin/vllm-fork test "$dir" --python "$python" --prove-fail
