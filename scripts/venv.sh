# Sourced by the other scripts: make sure .venv holds the tool (with EXTRAS).
# Re-installs only when pyproject.toml or the extras changed. uv installs it
# (pip where uv cannot be had, or with VLLM_FORK_INSTALLER=pip), from the indexes
# of the user's pip and uv configuration (fill_venv).

ensure_venv() {
    local extras="${1:-}"
    local python="${PYTHON:-python3}"
    local spec="."
    [[ -n "$extras" ]] && spec=".[$extras]"
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
        echo "error: $python is older than Python 3.10 (set PYTHON=...)" >&2
        return 1
    fi
    local stamp=".venv/.vllm-fork-installed" want
    want="$(venv_stamp "$extras")"
    if [[ ! -x .venv/bin/python || ! -f "$stamp" ]] || ! grep -qx "$want" "$stamp"; then
        fill_venv "$python" "$spec"
        echo "$want" >> "$stamp"
    fi
}

# venv_stamp EXTRAS: what .venv/.vllm-fork-installed holds once the tool is
# installed with EXTRAS from this pyproject.toml.
venv_stamp() {
    local want
    want="$(cat pyproject.toml; echo "extras=$1")"
    printf '%s' "$want" | sha256sum | cut -d' ' -f1
}

# fill_venv PYTHON SPEC: make .venv (with pip) and install SPEC into it, with uv at
# the pin of pyproject.toml's dev extras (put into .venv first: its wheel carries
# the binary), or with pip where uv cannot be had or VLLM_FORK_INSTALLER=pip. Both
# get the same indexes (vllm_fork/sources/installer.py, run from src/ here).
fill_venv() {
    local python="$1" spec="$2" pin uv=""
    local installer=(env PYTHONPATH=src .venv/bin/python -m vllm_fork.sources.installer .venv)
    if [[ ! -x .venv/bin/python ]]; then
        "$python" -m venv .venv
    fi
    if [[ "${VLLM_FORK_INSTALLER:-auto}" != pip ]]; then
        pin="$(grep -o '"uv==[^"]*"' pyproject.toml | tr -d '"')"
        if [[ "$(.venv/bin/uv --version 2>/dev/null | cut -d' ' -f2)" == "${pin#uv==}" ]] ||
            VLLM_FORK_INSTALLER=pip "${installer[@]}" "$pin"; then
            uv=.venv/bin/uv
        elif [[ "${VLLM_FORK_INSTALLER:-auto}" == uv ]]; then
            echo "error: VLLM_FORK_INSTALLER=uv, but $pin cannot be installed" >&2
            return 1
        else
            echo "note: $pin cannot be installed; pip fills .venv" >&2
        fi
    fi
    UV="$uv" "${installer[@]}" -e "$spec"
}

# The default base recorded in bases.toml (needs ensure_venv first).
default_base() {
    .venv/bin/python -c 'from pathlib import Path; from vllm_fork.sources.pins import load_pins; print(load_pins(Path("bases.toml")).get(None).version)'
}
