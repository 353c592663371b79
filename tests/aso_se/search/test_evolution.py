"""Pruning of weak ops (the evolve phase's discrete half)."""
from __future__ import annotations

import torch

from aso_se.search.arch_params import BatchedArchitectureUpdate
from aso_se.search.evolution import prune_weak_ops, track_weak_ops
from search_space.ops import DARTS_PRIMITIVES


def test_pruning_drops_ops_that_stayed_weak_but_keeps_each_edges_best() -> None:
    arch = BatchedArchitectureUpdate(3, DARTS_PRIMITIVES)
    with torch.no_grad():
        arch.alpha.copy_(torch.tensor([
            [5.0, 0, 0, 0, 0, 0, 0, 0],     # none dominates: keep none and the best other op (index 1 on ties)
            [0, 0, 0, 0, 4.0, 4.0, 0, 0],   # two strong ops
            [0.0] * 8,                      # uniform: nothing under the threshold
        ]))
    track_weak_ops(arch, prune_threshold=0.05)
    with torch.no_grad():
        arch.alpha[1, 6] = 3.0  # op 6 of edge 1 rises above the threshold at the second check: kept
    track_weak_ops(arch, prune_threshold=0.05)
    pruned = prune_weak_ops(arch)
    assert arch.op_mask.tolist() == [
        [True, True, False, False, False, False, False, False],
        [False, False, False, False, True, True, True, False],
        [True] * 8,
    ]
    assert pruned == 6 + 5
    assert arch.stayed_below.all()  # tracking restarts for the next cycle
    assert (arch.probabilities()[~arch.op_mask] == 0).all()
