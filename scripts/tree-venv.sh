# Sourced by the scripts that run vLLM's own code: make sure VENV holds CPU
# torch, the requirements of the vLLM tree TREE and the test tools.
# Re-installs only when the tree's requirements or the torch spec changed.
#
# TREE_TORCH picks torch (default torch==2.13.0: a CPU build is enough, no
# GPU code runs; set it to e.g. torch==2.11.0 to match a base's pin).

ensure_tree_venv() {
    local tree="$1" venv="$2"
    local python="${PYTHON:-python3}"
    local torch_spec="${TREE_TORCH:-torch==2.13.0}"
    if [[ ! -x "$venv/bin/python" ]]; then
        "$python" -m venv "$venv"
    fi
    local stamp="$venv/.vllm-fork-tree-installed"
    local want
    want="$(cat "$tree/requirements/common.txt"; echo "torch=$torch_spec")"
    want="$(printf '%s' "$want" | sha256sum | cut -d' ' -f1)"
    if [[ ! -f "$stamp" ]] || ! grep -qx "$want" "$stamp"; then
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$torch_spec"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            -r "$tree/requirements/common.txt" pytest hypothesis tblib
        echo "$want" >> "$stamp"
    fi
}
