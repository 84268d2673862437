# Sourced by the scripts that run vLLM's own code (after ensure_venv): the
# Python of the tree venv, CPU torch + the tree's requirements/common.txt +
# the test tools. One venv per torch spec, shared by every base and checkout,
# kept in the tool's cache (vllm_fork.testing.treevenv makes it; set
# TREE_TORCH, e.g. torch==2.11.0, to pick another torch than the default).

# tree_python TREE: print the interpreter for the vLLM work tree TREE.
tree_python() {
    .venv/bin/python -m vllm_fork.testing.treevenv "$1"
}

# ensure_tree_venv TREE VENV: make VENV a link to the shared tree venv of TREE.
ensure_tree_venv() {
    local tree="$1" venv="$2" python
    python="$(tree_python "$tree")"
    if [[ -e "$venv" && ! -L "$venv" ]]; then
        echo "error: $venv is a directory of its own, not a link to the shared tree venv; move it away" >&2
        return 1
    fi
    ln -sfn "$(dirname "$(dirname "$python")")" "$venv"
}
