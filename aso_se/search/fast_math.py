"""Entropy and KL divergence of the architecture distribution, one row per edge.

Both read logits (α, ``-inf`` for pruned ops) through ``log_softmax``, never ``log(softmax(...))``,
so tiny probabilities keep their precision and pruned ops contribute 0 with a zero (not NaN) gradient.
They run eager: torch.compile of them cost 8.6 s + 1.3 s on a fresh H100 and saved nothing per call
(benchmarks/bench_arch_math.py, in git history at 3b7d88c), a loss in every search we run.
"""
from __future__ import annotations

import torch
from torch import Tensor


def _finite_log_probs(logits: Tensor) -> tuple[Tensor, Tensor]:
    """(probabilities, log-probabilities with 0 where the probability is exactly 0)."""
    log_probs = torch.log_softmax(logits, dim=-1)
    # masked_fill (not torch.where on the product) keeps 0 * -inf out of forward AND backward.
    return log_probs.exp(), log_probs.masked_fill(torch.isneginf(logits), 0.0)


def entropy(logits: Tensor) -> Tensor:
    """Entropy (nats) of ``softmax(logits)`` along the last dim, e.g. ``[edges, ops] -> [edges]``."""
    probs, log_probs = _finite_log_probs(logits)
    return -(probs * log_probs).sum(dim=-1)


def kl_divergence(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    """KL(softmax(p) || softmax(q)) (nats) along the last dim; q must be finite wherever p is."""
    probs_p, log_p = _finite_log_probs(logits_p)
    log_q = torch.log_softmax(logits_q, dim=-1).masked_fill(torch.isneginf(logits_p), 0.0)
    return (probs_p * (log_p - log_q)).sum(dim=-1)
