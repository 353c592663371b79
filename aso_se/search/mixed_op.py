"""FastMixedOp: an edge of the supernet that runs only the ops it is told to run."""
from __future__ import annotations

import functools
import operator
from typing import Iterable, Sequence

from torch import Tensor, nn

# A node of the supernet summed at once (its terms' gradients and result may go into graphed ops' buffers).
from kernels.weighted_sum import weighted_sum as weighted_sum
from search_space.ops import Zero


def sum_terms(terms: Iterable[Tensor]) -> Tensor:
    """``sum(terms)`` without Python's leading ``0 +``, which costs one extra kernel per call."""
    return functools.reduce(operator.add, terms)


class FastMixedOp(nn.Module):
    """DARTS's MixedOp restricted to ``active_ops``: ``sum(w * ops[i](x) for w, i in zip(weights, active_ops))``.

    The caller picks ``active_ops`` (host ints, ``aso_se.search.arch_params.draw_samples``) and their
    ``weights`` in the same order (``aso_se.search.arch_params.active_weights``) once for all edges; the
    other ops cost nothing. ``none`` terms are skipped unless alone: they add ``w * 0``, so values (up to
    the sign of a zero) and gradients are unchanged. With every op active this is DARTS's MixedOp term
    for term, so outputs and gradients match it. The supernet runs an edge's ops itself and sums all
    edges of a node at once (``supernet.node_terms``, :func:`weighted_sum`); this per-edge ``forward`` is
    the reference that path is tested against.
    """

    def __init__(self, ops: Iterable[nn.Module]) -> None:
        super().__init__()
        self.ops = nn.ModuleList(ops)

    def forward(self, x: Tensor, weights: Sequence[Tensor], active_ops: Sequence[int]) -> Tensor:
        terms = [(w, self.ops[i]) for w, i in zip(weights, active_ops) if not isinstance(self.ops[i], Zero)]
        if not terms:  # only `none` is active: the edge's output is its zeros
            terms = [(weights[0], self.ops[active_ops[0]])]
        return sum_terms(w * op(x) for w, op in terms)
