"""Run in a venv where vLLM is installed without its dependencies: report what
``inside/importcheck.py`` reports, without importing vLLM.

Prints one JSON object (read by :func:`vllm_fork.wheel.smoke.smoke`).
"""

import importlib.metadata as md
import importlib.util
import json
import os
import re
import sys

VERSION_PY = re.compile(r"__version__ = version = ['\"]([^'\"]+)")


def main() -> None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("vllm is not installed here")
    package_dir = list(spec.submodule_search_locations)[0]
    with open(os.path.join(package_dir, "_version.py"), encoding="utf-8") as fh:
        found = VERSION_PY.search(fh.read())
    with open(os.path.join(package_dir, "_fork_provenance.json"), encoding="utf-8") as fh:
        provenance = fh.read()
    print(
        json.dumps(
            {
                "version": found.group(1) if found else None,
                "dist_version": md.version("vllm"),
                "package_dir": package_dir,
                "python": sys.version.split()[0],
                "provenance": provenance,
            }
        )
    )


if __name__ == "__main__":
    main()
