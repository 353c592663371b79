"""FastMixedOp: an edge of the supernet that runs only the ops it is told to run."""
from __future__ import annotations

import functools
import operator
from typing import Hashable, Iterable, Iterator, NamedTuple, Sequence

from torch import Tensor, nn

from aso_se.search.op_runner import EAGER, OpRunner

# A node of the supernet summed at once (its terms' gradients and result may go into graphed ops' buffers).
from kernels.weighted_sum import weighted_sum as weighted_sum


def sum_terms(terms: Iterable[Tensor]) -> Tensor:
    """``sum(terms)`` without Python's leading ``0 +``, which costs one extra kernel per call."""
    return functools.reduce(operator.add, terms)


class Term(NamedTuple):
    """One op's output in a node's sum, and the buffer its backward reads the gradient from (None: none)."""

    value: Tensor
    grad_buffer: Tensor | None


class FastMixedOp(nn.Module):
    """DARTS's MixedOp restricted to ``active_ops``: its terms ``ops[i](x)``, the other ops cost nothing.

    DARTS's edge is ``sum(w * ops[i](x))``; a node sums its edges. Here the node sums the terms of all its
    edges at once (``supernet.SearchCell``, :func:`weighted_sum`), so an edge yields its terms, not their
    sum. Each op runs as its term is taken: weighing and adding the terms as they come,
    ``sum_terms(w * t.value for w, t in zip(weights, edge(x, active)))`` is DARTS's MixedOp in DARTS's
    order, to the bit (gradients too) when every op is active. The caller picks ``active_ops`` (host ints,
    ``aso_se.search.arch_params.draw_samples``) and leaves ``none`` out (``supernet.node_terms``).
    ``run`` calls each op (``aso_se.search.op_runner``); ``slot`` is the edge's key there, to which the
    place of the op among ``active_ops`` is added, and ``source`` the key of the state ``x``.
    """

    def __init__(self, ops: Iterable[nn.Module]) -> None:
        super().__init__()
        self.ops = nn.ModuleList(ops)

    def forward(self, x: Tensor, active_ops: Sequence[int], run: OpRunner = EAGER, *, slot: tuple = (),
                source: Hashable = None) -> Iterator[Term]:
        for place, op in enumerate(active_ops):
            value = run((*slot, place), source, self.ops[op], x)
            yield Term(value, run.last_grad_buffer)
