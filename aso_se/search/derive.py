"""Genotype derivation: DARTS's discrete cell from α (top-2 inputs per node, their strongest non-none op).

``derive_genotype`` reads ``[edges, ops]`` probabilities; ``supernet_genotype`` is DARTS's
``Network.genotype()`` for the searched supernet.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import torch

from search_space.genotypes import Edge, Genotype, check_edge_caps
from search_space.ops import PARAMETER_FREE_OPS, POOL_OPS

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
    max_parameter_free: int | None = None, max_pools: int | None = None,
) -> tuple[Edge, ...]:
    """The genotype edges ``(op, input)`` of one cell type from its ``[edges, ops]`` probabilities.

    At most ``max_skip_connect`` skip_connect edges and ``max_parameter_free`` edges of PARAMETER_FREE_OPS (None =
    no cap), and at most ``max_pools`` pool edges (POOL_OPS; the normal cell's cap): while a cap is exceeded, the
    weakest chosen op it counts is excluded on its edge and the cell derived again (P-DARTS's remedy for the
    skip_connect collapse of DARTS, and the same for pools and skips together).
    """
    weights = probs.detach().double().cpu().tolist()
    named = [(name, cap, ops) for name, cap, ops in (
        ("search.evolution.max_skip_connect", max_skip_connect, {SKIP_OP}),
        ("search.evolution.max_parameter_free", max_parameter_free, PARAMETER_FREE_OPS),
        ("search.evolution.max_normal_pools", max_pools, POOL_OPS)) if cap is not None]
    check_edge_caps((name for name in primitives if name != NONE_OP), steps, named)
    caps = [({op for op, name in enumerate(primitives) if name in ops}, cap) for _, cap, ops in named]
    while True:
        chosen = _derive_cell(weights, primitives, steps)
        counted = _first_exceeded(chosen, caps)
        if counted is None:
            break
        edge, op = min(counted, key=lambda pair: weights[pair[0]][pair[1]])
        weights[edge][op] = -math.inf
    inputs = [j for node in range(steps) for j in range(node + 2)]  # input state of every edge
    return tuple((primitives[op], inputs[edge]) for edge, op in chosen)


def _first_exceeded(chosen: list[tuple[int, int]], caps: list[tuple[set[int], int]]) -> list[tuple[int, int]] | None:
    """The chosen (edge, op) pairs that the first exceeded cap counts, or None when every cap holds."""
    for ops, cap in caps:
        counted = [(edge, op) for edge, op in chosen if op in ops]
        if len(counted) > cap:
            return counted
    return None


def derive_genotype(
    normal_probs: torch.Tensor, reduce_probs: torch.Tensor, primitives: Sequence[str], *,
    steps: int, multiplier: int, max_skip_connect: int | None, max_parameter_free: int | None = None,
    max_normal_pools: int | None = None,
) -> Genotype:
    """DARTS's derivation for both cell types (``max_normal_pools``: the normal cell's cap on pool edges); the cell
    output concatenates the last ``multiplier`` nodes."""
    concat = tuple(range(2 + steps - multiplier, 2 + steps))
    return Genotype(
        normal=derive_cell(normal_probs, primitives, steps, max_skip_connect, max_parameter_free, max_normal_pools),
        normal_concat=concat,
        reduce=derive_cell(reduce_probs, primitives, steps, max_skip_connect, max_parameter_free),
        reduce_concat=concat,
    )


def supernet_genotype(supernet: SearchNetwork, max_skip_connect: int | None,
                      max_parameter_free: int | None = None, max_normal_pools: int | None = None) -> Genotype:
    """The genotype derived from ``supernet``'s current α (``derive_genotype``)."""
    probs = supernet.alpha_probabilities()
    space = supernet.search_space
    return derive_genotype(
        probs["normal"], probs["reduce"], space.primitives, steps=space.steps, multiplier=space.multiplier,
        max_skip_connect=max_skip_connect, max_parameter_free=max_parameter_free, max_normal_pools=max_normal_pools,
    )
