"""FastMixedOp: an edge of the supernet that runs only the ops it is told to run."""
from __future__ import annotations

import functools
import operator
from typing import Iterable, Sequence

from torch import Tensor, nn


def sum_terms(terms: Iterable[Tensor]) -> Tensor:
    """``sum(terms)`` without Python's leading ``0 +``, which costs one extra kernel per call."""
    return functools.reduce(operator.add, terms)


class FastMixedOp(nn.Module):
    """``sum(weights[i] * ops[i](x) for i in active_ops)``: DARTS's MixedOp restricted to ``active_ops``.

    ``active_ops`` (host ints, from one batched draw: ``aso_se.arch_params.draw_samples``) decides
    which ops run; the others cost nothing. With every op active this is DARTS's MixedOp term for
    term, in the same order (without sum()'s leading ``0 +``, which adds exactly nothing), so
    outputs and gradients match it exactly. Which ops are active
    (top-k during search, the argmax op in eval mode) and the straight-through weights that give
    every α a gradient are decided by the caller, once for all edges.
    """

    def __init__(self, ops: Iterable[nn.Module]) -> None:
        super().__init__()
        self.ops = nn.ModuleList(ops)

    def forward(self, x: Tensor, weights: Tensor, active_ops: Sequence[int]) -> Tensor:
        return sum_terms(weights[i] * self.ops[i](x) for i in active_ops)
