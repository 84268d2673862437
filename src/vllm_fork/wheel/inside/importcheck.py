"""Run in a smoke venv: import the installed vLLM on CPU and report what it sees.

Prints one JSON object (read by :func:`vllm_fork.wheel.smoke.smoke`).
"""

import importlib.metadata as md
import json
import os
import sys

import vllm


def main() -> None:
    package_dir = os.path.dirname(vllm.__file__)
    with open(os.path.join(package_dir, "_fork_provenance.json"), encoding="utf-8") as fh:
        provenance = fh.read()
    print(
        json.dumps(
            {
                "version": vllm.__version__,
                "dist_version": md.version("vllm"),
                "package_dir": package_dir,
                "python": sys.version.split()[0],
                "provenance": provenance,
            }
        )
    )


if __name__ == "__main__":
    main()
