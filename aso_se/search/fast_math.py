"""Entropy and KL divergence of the architecture distribution, one row per edge.

Both read logits (α, ``-inf`` for pruned ops) through ``log_softmax``, never ``log(softmax(...))``,
so tiny probabilities keep their precision and pruned ops contribute 0 with a zero (not NaN) gradient.
On CUDA they run through ``torch.compile``, fusing several tiny kernels into one per direction (the
supernet step is launch-bound); if compilation fails they fall back to eager, with one warning.
CPU tensors run eager: for tensors this small a CPU compile costs far more than it saves.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import Tensor

logger = logging.getLogger(__name__)


def _finite_log_probs(logits: Tensor) -> tuple[Tensor, Tensor]:
    """(probabilities, log-probabilities with 0 where the probability is exactly 0)."""
    log_probs = torch.log_softmax(logits, dim=-1)
    # masked_fill (not torch.where on the product) keeps 0 * -inf out of forward AND backward.
    return log_probs.exp(), log_probs.masked_fill(torch.isneginf(logits), 0.0)


def _entropy(logits: Tensor) -> Tensor:
    probs, log_probs = _finite_log_probs(logits)
    return -(probs * log_probs).sum(dim=-1)


def _kl_divergence(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    probs_p, log_p = _finite_log_probs(logits_p)
    log_q = torch.log_softmax(logits_q, dim=-1).masked_fill(torch.isneginf(logits_p), 0.0)
    return (probs_p * (log_p - log_q)).sum(dim=-1)


class CompiledWithFallback:
    """Calls ``torch.compile(fn)`` for inputs on ``devices`` and ``fn`` itself otherwise, or for
    good after the first compile failure (logged once)."""

    def __init__(self, fn: Callable[..., Tensor], devices: frozenset[str] = frozenset({"cuda"})) -> None:
        self._eager = fn
        self._devices = devices
        self._compiled: Callable[..., Tensor] | None = None
        self._compile_failed = False

    def __call__(self, *tensors: Tensor) -> Tensor:
        if self._compile_failed or tensors[0].device.type not in self._devices:
            return self._eager(*tensors)
        try:
            if self._compiled is None:
                self._compiled = torch.compile(self._eager, fullgraph=True, dynamic=False)
            return self._compiled(*tensors)
        except Exception as error:  # any compiler failure: the eager function computes the same thing
            logger.warning("torch.compile failed for %s (%s); using eager PyTorch", self._eager.__name__, error)
            self._compile_failed = True
            return self._eager(*tensors)


_compiled_entropy = CompiledWithFallback(_entropy)
_compiled_kl_divergence = CompiledWithFallback(_kl_divergence)


def entropy(logits: Tensor) -> Tensor:
    """Entropy (nats) of ``softmax(logits)`` along the last dim, e.g. ``[edges, ops] -> [edges]``."""
    return _compiled_entropy(logits)


def kl_divergence(logits_p: Tensor, logits_q: Tensor) -> Tensor:
    """KL(softmax(p) || softmax(q)) (nats) along the last dim; q must be finite wherever p is."""
    return _compiled_kl_divergence(logits_p, logits_q)
