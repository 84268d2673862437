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


def test_golden_outputs_catch_a_fake_that_ignores_the_group_limit(monkeypatch):
    import aiter

    real = aiter.biased_grouped_topk

    def no_group_limit(gating, bias, weights, ids, num_expert_group, topk_group, *args):
        real(gating, bias, weights, ids, num_expert_group, num_expert_group, *args)

    monkeypatch.setattr(aiter, "biased_grouped_topk", no_group_limit)
    _, failures = contracts.golden_mismatches(aiter)
    assert failures
    assert all(
        f.startswith("aiter.biased_grouped_topk vs biased_grouped_topk_torch") for f in failures
    )
