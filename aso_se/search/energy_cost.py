"""The spike-aware α loss: each op's energy per image, measured on the supernet, and its expectation under α.

``measure_op_costs`` runs the supernet once with every op of every edge computed (weights softmax(α)),
counting each conv and linear with ``search_space.energy.count_energy`` (SOPs for spike inputs at their
measured firing rates, MACs otherwise), and sums the counts per (cell type, edge, op) over the cells of
each type. ``expected_energy`` is differentiable in α; the engine adds ``energy_weight * E_α / E_uniform``
to the α loss, so ``energy_weight`` is unitless: the loss paid by a cell as costly as the uniform mixture.
"""
from __future__ import annotations

import re

import torch
from torch import Tensor, nn

from aso_se.search.arch_params import EVERY_OP
from aso_se.search.supernet import CELL_TYPES, SearchNetwork
from search_space.energy import E_AC_PJ, E_MAC_PJ, count_energy

_OP_NAME = re.compile(r"(?:^|\.)cells\.(\d+)\.cell\.edges\.(\d+)\.ops\.(\d+)(?:\.|$)")


class _EveryOp(nn.Module):
    """The supernet as a one-argument module that computes every unpruned op (count_energy calls ``model(x)``)."""

    def __init__(self, supernet: SearchNetwork) -> None:
        super().__init__()
        self.supernet = supernet

    def forward(self, x: Tensor) -> Tensor:
        every_op = self.supernet.draw(1, EVERY_OP, temperature=1.0)[0]
        return self.supernet(x, every_op, arch_grad=False)


@torch.no_grad()
def measure_op_costs(supernet: SearchNetwork, images: Tensor, *, e_ac_pj: float = E_AC_PJ,
                     e_mac_pj: float = E_MAC_PJ) -> Tensor:
    """``[cell types, edges, ops]`` µJ per image of each op on ``images`` (eval mode; parameter-free ops: 0)."""
    arch = supernet.arch[CELL_TYPES[0]].alpha
    costs = torch.zeros(len(CELL_TYPES), *arch.shape, dtype=torch.float64)
    cell_type = ["reduce" if kind == "reduction" else "normal" for kind in supernet.structure.cells]
    was_training = supernet.training
    supernet.eval()
    try:
        report = count_energy(_EveryOp(supernet), images, e_ac_pj=e_ac_pj, e_mac_pj=e_mac_pj)
    finally:
        supernet.train(was_training)
    for layer in report.layers:
        match = _OP_NAME.search(layer.name)
        if match is None:  # the stem, cell preprocessing, the classifier: the same for every α
            continue
        cell, edge, op = map(int, match.groups())
        energy_uj = (e_ac_pj * layer.sops + e_mac_pj * layer.macs) * 1e-6 / report.images
        costs[CELL_TYPES.index(cell_type[cell]), edge, op] += energy_uj
    return costs.to(device=arch.device, dtype=torch.float32)


def expected_energy(logits: Tensor, costs: Tensor) -> Tensor:
    """Σ softmax(logits) · costs over all cell types, edges and ops (``-inf`` logits: pruned, weight 0)."""
    return (torch.softmax(logits, dim=-1) * costs).sum()


def uniform_energy(logits: Tensor, costs: Tensor) -> Tensor:
    """The expected energy when every unpruned op of an edge is equally likely (the energy term's unit)."""
    kept = torch.isfinite(logits).to(costs.dtype)
    return (kept / kept.sum(dim=-1, keepdim=True) * costs).sum()

