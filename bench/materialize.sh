#!/usr/bin/env bash
# Time `vllm-fork materialize` of a base: first with an empty download cache
# (download + verify + unpack + import + checkout + series), then again with
# the cache warm. Prints wall seconds for both runs.
# Usage: bench/materialize.sh [BASE]        (default: the default base)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
ensure_venv ""

base_args=()
[[ $# -ge 1 ]] && base_args=(--base "$1")
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
export VLLM_FORK_CACHE_DIR="$scratch/cache"

run() {
    local label="$1" dir="$2" start end
    start="$(date +%s.%N)"
    .venv/bin/vllm-fork materialize "${base_args[@]}" "$dir" >/dev/null
    end="$(date +%s.%N)"
    python3 -c 'import sys; print(f"{sys.argv[1]:<28} {float(sys.argv[3]) - float(sys.argv[2]):6.1f} s")' \
        "$label" "$start" "$end"
}

echo "materialize ${1:-(default base)} on $(nproc) cores"
run "first run (empty cache)" "$scratch/first"
run "second run (cached)" "$scratch/second"
