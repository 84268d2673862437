#!/usr/bin/env bash
# Lint and test the tool: ruff check, ruff format --check, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -m "not network").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/venv.sh
ensure_venv dev

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
