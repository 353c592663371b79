"""Structure evolution, the discrete half: prune ops that stay weak, and how much to grow.

(Deriving the genotype is ``aso_se.search.derive``; growing the supernet is ``aso_se.search.growth``.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from aso_se.search.arch_params import BatchedArchitectureUpdate
from aso_se.search.derive import NONE_OP
from aso_se.search.supernet import SupernetStructure
from search_space.errors import UserInputError
from search_space.genotypes import Genotype


@dataclass(frozen=True)
class CycleResult:
    """A cycle's outcome: its derived genotype and the supernet it leaves for the next cycle."""

    cycle: int
    genotype: Genotype
    structure: SupernetStructure
    pruned_ops: int


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
    on skip_connect edges per cell (None = no cap); ``max_parameter_free``: its cap on edges of parameter-free ops
    (pools and skips, search_space.ops.PARAMETER_FREE_OPS) per cell (None = no cap); ``max_normal_pools``: its cap
    on pool edges in the normal cell (POOL_OPS; 0 = no pools there, as in DARTS_V2's normal cell; None = no cap).
    """

    grow_cells: int = 1
    max_cells: int | None = 8
    width_factor: int = 1
    max_channels: int | None = 16
    prune_threshold: float = 0.05
    max_skip_connect: int | None = 2
    max_parameter_free: int | None = None
    max_normal_pools: int | None = None

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
        for name in ("max_skip_connect", "max_parameter_free", "max_normal_pools"):
            cap = getattr(self, name)
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
                raise UserInputError(f"evolution {name}={cap!r}: need null (no cap) or a count >= 0; "
                                     f"fix search.evolution.{name}")

    def growth(self, structure: SupernetStructure) -> tuple[int, int]:
        """(new cells, width factor) of the growth of a supernet of ``structure``, within max_cells and
        max_channels; (0, 1): no growth."""
        new_cells = self.grow_cells
        if self.max_cells is not None:
            new_cells = max(0, min(new_cells, self.max_cells - len(structure.cells)))
        width_factor = self.width_factor
        if self.max_channels is not None and structure.channels * width_factor > self.max_channels:
            width_factor = 1
        return new_cells, width_factor
