# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The fake aiter reproduces AITER's own PyTorch references (golden outputs
recorded by scripts/aiter_contracts.py at every pinned tag), and keeps the
recorded signatures. Runs in each vLLM tree's venv, which has torch."""

import pytest
from vllm_rocm_sim import contracts

pytestmark = pytest.mark.usefixtures("rocm_sim")


def test_fake_routing_reproduces_aiter_torch_references():
    import aiter

    compared, failures = contracts.golden_mismatches(aiter)
    assert not failures, "\n".join(failures)
    assert compared >= 10


def test_fake_signatures_keep_the_contracts():
    _, failures = contracts.check_bases()
    assert not failures, "\n".join(failures)
