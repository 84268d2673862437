#!/usr/bin/env bash
# The main job: build the hardened vLLM wheel for a base (default: the default
# base) with vLLM's own build, verified against the series and pins.
# Sets up .venv with the tool; downloads (sdist, upstream wheel, build env)
# are verified and cached in the user cache directory.
# Usage: scripts/main.sh [extra `vllm-fork build` options, e.g. --device rocm]
#        --device rocm: the wheel for AMD GPUs from upstream's ROCm wheel that bases.toml
#        pins for the base (once: `scripts/vllm-fork pin V --rocm-index URL`; docs/build.md,
#        "ROCm wheel")
#        BASE=0.20.0 scripts/main.sh        another pinned base
#        DIST=out scripts/main.sh            output directory (default: dist)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
ensure_venv ""

base="${BASE:-$(default_base)}"
dist="${DIST:-dist}"
.venv/bin/vllm-fork status --base "$base"
# build verifies the wheel against its tree, the series and the pins before placing it
# (`vllm-fork verify WHEEL` checks it again anywhere later, with its release files)
.venv/bin/vllm-fork build --base "$base" -o "$dist" "$@"
