"""What a build Python has: its version, the build packages and torch's GPU runtime.

``python -I pyinfo.py`` prints the JSON object read by
:func:`vllm_fork.wheel.env.probe_python`; ``python -I pyinfo.py version`` prints
only ``{"python": "3.11"}`` (no torch import).
"""

import importlib.metadata as md
import json
import sys

DISTRIBUTIONS = ("torch", "setuptools", "setuptools-scm", "cmake", "ninja", "packaging")


def main() -> None:
    out: dict = {"python": f"{sys.version_info[0]}.{sys.version_info[1]}"}
    if sys.argv[1:] != ["version"]:
        for dist in DISTRIBUTIONS:
            try:
                out[dist] = md.version(dist)
            except md.PackageNotFoundError:
                out[dist] = None
        try:
            import torch

            out["torch_cuda"] = torch.version.cuda
            out["torch_hip"] = torch.version.hip
        except Exception as exc:  # any import failure is reported, not raised
            out["torch_error"] = repr(exc)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
