"""Tooling for the hardened ROCm fork of vLLM: pinned bases, patch series,
materialize, status, build and rebase."""

__version__ = "0.1.0"
