# Sourced by the other scripts: make sure .venv holds the tool (with EXTRAS).
# Re-installs only when pyproject.toml or the extras changed.

ensure_venv() {
    local extras="${1:-}"
    local python="${PYTHON:-python3}"
    local spec="."
    [[ -n "$extras" ]] && spec=".[$extras]"
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
        echo "error: $python is older than Python 3.10 (set PYTHON=...)" >&2
        return 1
    fi
    if [[ ! -x .venv/bin/python ]]; then
        "$python" -m venv .venv
    fi
    local stamp=".venv/.vllm-fork-installed"
    local want
    want="$(cat pyproject.toml; echo "extras=$extras")"
    want="$(printf '%s' "$want" | sha256sum | cut -d' ' -f1)"
    if [[ ! -f "$stamp" ]] || ! grep -qx "$want" "$stamp"; then
        .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
        echo "$want" >> "$stamp"
    fi
}

# The default base recorded in bases.toml (needs ensure_venv first).
default_base() {
    .venv/bin/python -c 'from pathlib import Path; from vllm_fork.sources.pins import load_pins; print(load_pins(Path("bases.toml")).get(None).version)'
}
