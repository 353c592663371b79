"""fast_math: entropy and KL of the architecture distribution against the textbook formulas."""
from __future__ import annotations

import math

import pytest
import torch

from aso_se.search import fast_math


def naive_entropy(logits: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits.double(), dim=-1)
    return torch.tensor([-sum(p * math.log(p) for p in row.tolist() if p > 0) for row in probs], dtype=torch.float64)


def naive_kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    p, q = torch.softmax(p_logits.double(), -1), torch.softmax(q_logits.double(), -1)
    return torch.tensor(
        [sum(a * math.log(a / b) for a, b in zip(pr.tolist(), qr.tolist()) if a > 0) for pr, qr in zip(p, q)]
    )


def masked_logits(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(7, 5, generator=generator)
    pruned = torch.rand(7, 5, generator=generator) < 0.3
    pruned[:, 0] = False  # every edge keeps an op
    return logits.masked_fill(pruned, float("-inf"))


def test_entropy_matches_the_formula_including_pruned_ops() -> None:
    logits = masked_logits(0)
    assert torch.isinf(logits).any()
    torch.testing.assert_close(fast_math.entropy(logits).double(), naive_entropy(logits), rtol=1e-5, atol=1e-6)


def test_entropy_is_stable_for_extreme_logits() -> None:
    logits = torch.tensor([[200.0, -200.0, 0.0], [1e-3, 0.0, 0.0]])
    entropy = fast_math.entropy(logits)
    assert torch.isfinite(entropy).all()
    assert entropy[0].item() == pytest.approx(0.0, abs=1e-6)
    assert entropy[1].item() == pytest.approx(math.log(3), abs=1e-6)


def test_gradients_are_finite_and_zero_on_pruned_ops() -> None:
    logits = masked_logits(1)
    alpha = logits.masked_fill(torch.isinf(logits), 0.0).requires_grad_()
    pruned = torch.isinf(logits)
    (fast_math.entropy(alpha.masked_fill(pruned, float("-inf"))).sum()
     + fast_math.kl_divergence(alpha.masked_fill(pruned, float("-inf")), torch.zeros(7, 5)).sum()).backward()
    assert torch.isfinite(alpha.grad).all()
    assert (alpha.grad[pruned] == 0).all() and (alpha.grad[~pruned] != 0).any()


def test_kl_matches_the_formula() -> None:
    p, q = masked_logits(2), torch.randn(7, 5, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(fast_math.kl_divergence(p, q).double(), naive_kl(p, q).double(), rtol=1e-5, atol=1e-6)
    assert fast_math.kl_divergence(q, q).abs().max() < 1e-6
