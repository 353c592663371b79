"""Genotype derivation: DARTS's discrete cell from α (top-2 inputs per node, their strongest non-none op).

``derive_genotype`` reads ``[edges, ops]`` probabilities; ``supernet_genotype`` is DARTS's
``Network.genotype()`` for the searched supernet.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import torch

from search_space.errors import UserInputError
from search_space.genotypes import Edge, Genotype
from search_space.ops import PARAMETER_FREE_OPS

if TYPE_CHECKING:  # derivation itself needs only probabilities
    from aso_se.search.supernet import SearchNetwork

NONE_OP = "none"
SKIP_OP = "skip_connect"


def _derive_cell(probs: list[list[float]], primitives: Sequence[str], steps: int) -> list[tuple[int, int]]:
    """DARTS's rule on one cell's ``[edges][ops]`` weights: per node the 2 input edges with the
    strongest non-none op, each with that op. Returns ``(edge, op)`` pairs, node by node."""
    candidates = [op for op, name in enumerate(primitives) if name != NONE_OP]
    chosen, start = [], 0
    for node in range(steps):
        edges = range(start, start + node + 2)
        best_op = {edge: max(candidates, key=lambda op: probs[edge][op]) for edge in edges}
        # sorted() is stable: ties go to the earlier input, as in DARTS.
        inputs = sorted(edges, key=lambda edge: -probs[edge][best_op[edge]])[:2]
        chosen += [(edge, best_op[edge]) for edge in inputs]
        start += node + 2
    return chosen


def derive_cell(
    probs: torch.Tensor, primitives: Sequence[str], steps: int, max_skip_connect: int | None,
    max_parameter_free: int | None = None,
) -> tuple[Edge, ...]:
    """The genotype edges ``(op, input)`` of one cell type from its ``[edges, ops]`` probabilities.

    At most ``max_skip_connect`` skip_connect edges and ``max_parameter_free`` edges of PARAMETER_FREE_OPS (None =
    no cap): while a cap is exceeded, the weakest chosen op it counts is excluded on its edge and the cell derived
    again (P-DARTS's remedy for the skip_connect collapse of DARTS, and the same for pools and skips together).
    """
    weights = probs.detach().double().cpu().tolist()
    caps = [({primitives.index(SKIP_OP)} if SKIP_OP in primitives else set(), max_skip_connect),
            ({op for op, name in enumerate(primitives) if name in PARAMETER_FREE_OPS}, max_parameter_free)]
    caps = [(ops, cap) for ops, cap in caps if cap is not None]
    _check_caps(primitives, steps, caps)
    while True:
        chosen = _derive_cell(weights, primitives, steps)
        counted = next((pairs for pairs, cap in (([p for p in chosen if p[1] in ops], cap) for ops, cap in caps)
                        if len(pairs) > cap), None)  # the chosen (edge, op) pairs of the first cap exceeded
        if counted is None:
            break
        edge, op = min(counted, key=lambda pair: weights[pair[0]][pair[1]])
        weights[edge][op] = -math.inf
    inputs = [j for node in range(steps) for j in range(node + 2)]  # input state of every edge
    return tuple((primitives[op], inputs[edge]) for edge, op in chosen)


def _check_caps(primitives: Sequence[str], steps: int, caps: list[tuple[set[int], int]]) -> None:
    """A cap below the cell's 2·steps edges needs an op it does not count (else no cell satisfies it)."""
    candidates = {op for op, name in enumerate(primitives) if name != NONE_OP}
    for ops, cap in caps:
        if cap < 0 or (cap < 2 * steps and candidates <= ops):
            raise UserInputError(f"the derivation cannot keep at most {cap} of {2 * steps} edges on "
                                 f"{sorted(primitives[op] for op in ops)}: add other ops to the primitives or "
                                 "raise search.evolution's cap")


def derive_genotype(
    normal_probs: torch.Tensor, reduce_probs: torch.Tensor, primitives: Sequence[str], *,
    steps: int, multiplier: int, max_skip_connect: int | None, max_parameter_free: int | None = None,
) -> Genotype:
    """DARTS's derivation for both cell types; the cell output concatenates the last ``multiplier`` nodes."""
    concat = tuple(range(2 + steps - multiplier, 2 + steps))
    return Genotype(
        normal=derive_cell(normal_probs, primitives, steps, max_skip_connect, max_parameter_free),
        normal_concat=concat,
        reduce=derive_cell(reduce_probs, primitives, steps, max_skip_connect, max_parameter_free),
        reduce_concat=concat,
    )


def supernet_genotype(supernet: SearchNetwork, max_skip_connect: int | None,
                      max_parameter_free: int | None = None) -> Genotype:
    """The genotype derived from ``supernet``'s current α (``derive_genotype``)."""
    probs = supernet.alpha_probabilities()
    space = supernet.search_space
    return derive_genotype(
        probs["normal"], probs["reduce"], space.primitives, steps=space.steps, multiplier=space.multiplier,
        max_skip_connect=max_skip_connect, max_parameter_free=max_parameter_free,
    )
