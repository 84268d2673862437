"""``python -m vllm_fork.provenance``: the documented command that prints the
provenance record of the installed fork build of vLLM.

The record and its reader live in :mod:`vllm_fork.wheel.provenance`; this
module only keeps the command's name. It is an entry point, like
:mod:`vllm_fork.__main__`, so it sits in the top layer beside the CLI.
"""

import sys

from vllm_fork.wheel.provenance import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
