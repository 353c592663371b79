"""Structure evolution, the discrete half: derive the genotype from α, prune ops that stay weak.

(Growing the supernet is ``aso_se.search.growth``.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from aso_se.search.arch_params import BatchedArchitectureUpdate
from search_space.errors import UserInputError
from search_space.genotypes import Edge, Genotype

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
    probs: torch.Tensor, primitives: Sequence[str], steps: int, max_skip_connect: int | None
) -> tuple[Edge, ...]:
    """The genotype edges ``(op, input)`` of one cell type from its ``[edges, ops]`` probabilities.

    At most ``max_skip_connect`` skip_connect edges (None = no cap): while there are more, the
    weakest chosen skip_connect is excluded and the cell derived again (P-DARTS's remedy for
    the skip_connect collapse of DARTS).
    """
    weights = probs.detach().double().cpu().tolist()
    skip = primitives.index(SKIP_OP) if SKIP_OP in primitives else None
    while True:
        chosen = _derive_cell(weights, primitives, steps)
        skips = [edge for edge, op in chosen if op == skip]
        if max_skip_connect is None or len(skips) <= max_skip_connect:
            break
        weakest = min(skips, key=lambda edge: weights[edge][skip])
        weights[weakest][skip] = -math.inf
    inputs = [j for node in range(steps) for j in range(node + 2)]  # input state of every edge
    return tuple((primitives[op], inputs[edge]) for edge, op in chosen)


def derive_genotype(
    normal_probs: torch.Tensor, reduce_probs: torch.Tensor, primitives: Sequence[str], *,
    steps: int, multiplier: int, max_skip_connect: int | None,
) -> Genotype:
    """DARTS's derivation for both cell types; the cell output concatenates the last ``multiplier`` nodes."""
    concat = tuple(range(2 + steps - multiplier, 2 + steps))
    return Genotype(
        normal=derive_cell(normal_probs, primitives, steps, max_skip_connect),
        normal_concat=concat,
        reduce=derive_cell(reduce_probs, primitives, steps, max_skip_connect),
        reduce_concat=concat,
    )


@torch.no_grad()
def track_weak_ops(arch: BatchedArchitectureUpdate, prune_threshold: float) -> None:
    """One pruning check (at every search epoch's end): clears ``stayed_below`` where an op's
    probability is at or above ``prune_threshold``. On the device, no host sync."""
    arch.stayed_below &= arch.probabilities() < prune_threshold


@torch.no_grad()
def prune_weak_ops(arch: BatchedArchitectureUpdate) -> int:
    """Prunes (masks for good) the ops that stayed under the threshold at every check since the last
    reset, except each edge's most likely op and most likely non-none op (so sampling and
    derivation always have a candidate); resets the tracking; returns how many ops were pruned."""
    probs = arch.probabilities()
    keep = torch.zeros_like(arch.op_mask)
    keep.scatter_(1, probs.argmax(dim=1, keepdim=True), True)
    if NONE_OP in arch.primitives:
        probs_without_none = probs.clone()
        probs_without_none[:, arch.primitives.index(NONE_OP)] = -1.0
        keep.scatter_(1, probs_without_none.argmax(dim=1, keepdim=True), True)
    pruned = arch.stayed_below & arch.op_mask & ~keep
    arch.op_mask &= ~pruned
    arch.stayed_below.fill_(True)
    return int(pruned.sum())


@dataclass(frozen=True)
class EvolutionConfig:
    """What a cycle's evolve phase does besides deriving the genotype.

    ``grow_cells``: grown cells added per evolution (up to ``max_cells`` in total);
    ``width_factor``: channel multiplier per evolution (1 = no widening; up to ``max_channels``
    base channels); ``prune_threshold``: prune ops whose probability stayed under it at every
    search epoch's end of the cycle (0 = never prune); ``max_skip_connect``: the derivation's cap
    on skip_connect edges per cell (None = no cap).
    """

    grow_cells: int = 1
    max_cells: int | None = 8
    width_factor: int = 1
    max_channels: int | None = 16
    prune_threshold: float = 0.05
    max_skip_connect: int | None = 2

    def __post_init__(self) -> None:
        if self.grow_cells < 0 or self.width_factor < 1:
            raise UserInputError(
                f"evolution grow_cells={self.grow_cells}, width_factor={self.width_factor}: need grow_cells >= 0 "
                "and an integer width_factor >= 1; fix search.evolution"
            )
        if not 0.0 <= self.prune_threshold < 1.0:
            raise UserInputError(
                f"evolution prune_threshold={self.prune_threshold}: need 0 <= threshold < 1; "
                "fix search.evolution.prune_threshold"
            )
