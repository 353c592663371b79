"""DARTS's cell and the network plan around it, shared by the retrain network and the supernet.

A cell has 2 input states (the outputs of the previous two cells, each preprocessed to C
channels), ``steps`` intermediate nodes, node ``i`` summing one op applied to each of two
earlier states, and outputs the concatenation of some nodes (a genotype's ``*_concat``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from kernels.drop_path_sum import NodeTerms, concat_node_sums, drop_path_sum, takes_sliced_gradients
from search_space.genotypes import Genotype
from search_space.grad_layout import grad_in_input_layout
from search_space.multistep import drop_path_scale
from search_space.neurons import NeuronFactoryFn
from search_space.ops import OPS, FactorizedReduce, NeuronConvBN


@dataclass(frozen=True)
class CellLayout:
    """Where a cell sits: its input channels, its own channels ``C``, and whether it or its predecessor reduces."""

    C_prev_prev: int
    C_prev: int
    C: int
    reduction: bool
    reduction_prev: bool


def reduction_indices(layers: int) -> tuple[int, int]:
    """DARTS's reduction cells, at 1/3 and 2/3 of the depth (the same cell twice when layers < 3)."""
    return layers // 3, 2 * layers // 3


def cell_layouts(
    layers: int, channels: int, stem_channels: int, *, normal_multiplier: int, reduce_multiplier: int,
    kinds: Sequence[str] | None = None,
) -> list[CellLayout]:
    """DARTS's channel plan: C doubles at each reduction; a cell outputs ``multiplier * C`` channels.

    ``kinds`` ("normal", "reduction", "grown"; default: DARTS's reductions at 1/3 and 2/3) lets a
    supernet insert grown cells, which add to their predecessor's output and so pass the channel
    plan through unchanged."""
    if kinds is None:
        kinds = ["reduction" if index in reduction_indices(layers) else "normal" for index in range(layers)]
    layouts = []
    C_prev_prev, C_prev, C = stem_channels, stem_channels, channels
    reduction_prev = False
    for kind in kinds:
        reduction = kind == "reduction"
        if reduction:
            C *= 2
        layouts.append(CellLayout(C_prev_prev, C_prev, C, reduction, reduction_prev))
        if kind != "grown":
            multiplier = reduce_multiplier if reduction else normal_multiplier
            C_prev_prev, C_prev, reduction_prev = C_prev, multiplier * C, reduction
    return layouts


def edge_stride(reduction: bool, input_index: int) -> int:
    """Edges of a reduction cell that read the cell's two inputs downsample; all other edges keep the size."""
    return 2 if reduction and input_index < 2 else 1


def cell_preprocessing(
    layout: CellLayout, *, neuron: NeuronFactoryFn, affine: bool = True
) -> tuple[nn.Module, nn.Module]:
    """The two input adapters to C channels; the older input is halved in size after a reduction cell."""
    if layout.reduction_prev:
        preprocess0: nn.Module = FactorizedReduce(layout.C_prev_prev, layout.C, neuron=neuron, affine=affine)
    else:
        preprocess0 = NeuronConvBN(layout.C_prev_prev, layout.C, 1, 1, 0, neuron=neuron, affine=affine)
    preprocess1 = NeuronConvBN(layout.C_prev, layout.C, 1, 1, 0, neuron=neuron, affine=affine)
    return preprocess0, preprocess1


class Cell(nn.Module):
    """DARTS's ``model.Cell``: a genotype's fixed cell, with drop-path on every non-identity op in training."""

    def __init__(self, genotype: Genotype, layout: CellLayout, *, neuron: NeuronFactoryFn, timesteps: int) -> None:
        super().__init__()
        self.reduction = layout.reduction
        self.timesteps = timesteps
        self.preprocess0, self.preprocess1 = cell_preprocessing(layout, neuron=neuron)
        edges, self._concat = genotype.cell(layout.reduction)
        self._indices = [index for _, index in edges]
        self._read_by_edges = set(self._indices)
        # DARTS's attribute name, so that state_dict keys (cells.N._ops.M...) match its checkpoints.
        self._ops = nn.ModuleList(
            OPS[name](layout.C, edge_stride(layout.reduction, index), True, neuron) for name, index in edges
        )
        self.multiplier = len(self._concat)
        self.drop_path_backend = "auto"  # kernels/drop_path_sum's; "torch" for a benchmark's baseline row
        self.sums_into_concat = True  # False: node tensors and torch.cat (a benchmark's baseline row)
        # True: the concatenation hands a node it also feeds to edges a dense gradient in its layout, so the sum with
        # the edges' gradients stays channels_last (no layout copy after it); a benchmark row until measured
        self.dense_concat_grads = False

    def forward(self, s0: torch.Tensor, s1: torch.Tensor, drop_prob: float | torch.Tensor) -> torch.Tensor:
        # Each state's gradient sums a slice of the concatenation's with its readers': keep it in the state's layout.
        # A node that only the concatenation reads, if the kernels sum it, is summed straight into the concatenation
        # (concat_node_sums: no node tensor, and its gradient slice is read where it lies), dropped or not: so an
        # eager step at drop_prob 0 and a graph that draws scales of 1 build the same autograd graph (equal bits).
        backend = self.drop_path_backend
        states: list[torch.Tensor | NodeTerms] = [grad_in_input_layout(self.preprocess0(s0)),
                                                 grad_in_input_layout(self.preprocess1(s1))]
        for node in range(len(self._ops) // 2):
            (a, scale_a), (b, scale_b) = (self._edge(edge, states, drop_prob) for edge in (2 * node, 2 * node + 1))
            if self.sums_into_concat and len(states) not in self._read_by_edges and takes_sliced_gradients(
                    a, b, scale_a, scale_b, self.timesteps, backend=backend):
                states.append((a, b, scale_a, scale_b))
            else:
                states.append(grad_in_input_layout(
                    drop_path_sum(a, b, scale_a, scale_b, self.timesteps, backend=backend)))
        return concat_node_sums([states[index] for index in self._concat], self.timesteps, backend=backend,
                                dense_grads=self.dense_concat_grads)

    def _edge(self, edge: int, states: list[torch.Tensor], drop_prob: float | torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The edge's op output and its drop-path scale per sample (None: not dropped)."""
        op = self._ops[edge]
        h = op(states[self._indices[edge]])
        # A tensor probability lives on the device (a CUDA graph replays it with each epoch's value): always drawn.
        drawn = isinstance(drop_prob, torch.Tensor) or drop_prob > 0.0
        if self.training and drawn and not isinstance(op, nn.Identity):
            return h, drop_path_scale(h, drop_prob, self.timesteps)
        return h, None
