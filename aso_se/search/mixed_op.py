"""FastMixedOp: an edge of the supernet that runs only the ops it is told to run."""
from __future__ import annotations

import functools
import operator
from typing import Iterable, Sequence

from torch import Tensor, nn

from search_space.ops import Zero


def sum_terms(terms: Iterable[Tensor]) -> Tensor:
    """``sum(terms)`` without Python's leading ``0 +``, which costs one extra kernel per call."""
    return functools.reduce(operator.add, terms)


class FastMixedOp(nn.Module):
    """``sum(weights[j] * ops[i](x) for j, i in enumerate(active_ops))``: DARTS's MixedOp restricted to ``active_ops``.

    ``active_ops`` (host ints, from one batched draw: ``aso_se.search.arch_params.draw_samples``) decides
    which ops run, and ``weights`` holds their weights in the same order
    (``aso_se.search.arch_params.active_weights``); the other ops cost nothing. ``none`` terms are left
    out (an op other than ``none`` runs whenever the edge has one): they add ``w * 0 = 0``, so
    the sum keeps its value (only a ``-0.0`` may come out as ``+0.0``) and every gradient stays
    the same (the ``none`` weight's term gives it exactly 0). With every op active this is
    DARTS's MixedOp term for term, in the same order, without sum()'s leading ``0 +``, so
    outputs and gradients match it. Which ops are active (top-k during search, the argmax op
    in eval mode) and the straight-through weights that give every α a gradient are decided by
    the caller, once for all edges.
    """

    def __init__(self, ops: Iterable[nn.Module]) -> None:
        super().__init__()
        self.ops = nn.ModuleList(ops)

    def forward(self, x: Tensor, weights: Sequence[Tensor], active_ops: Sequence[int]) -> Tensor:
        terms = [(w, self.ops[i]) for w, i in zip(weights, active_ops) if not isinstance(self.ops[i], Zero)]
        if not terms:  # only `none` is active: the edge's output is its zeros
            terms = [(weights[0], self.ops[active_ops[0]])]
        return sum_terms(w * op(x) for w, op in terms)
