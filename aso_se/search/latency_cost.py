"""The latency-aware α loss: the deployed binary SNN's longest chain of neurons, expected under α.

Why chains: a binary ST-BIF neuron emits its count one spike a step, so once its input has settled it needs up to
``steps_per_neuron`` more steps (L − 1 for L unsigned levels) before its output is final, and a signal that crossed
n neurons in a row is final n times that many steps after the image entered. A cell's latency is therefore its longest
chain of neurons from an input to its output: ops chain different numbers (:func:`neurons_chained`: DARTS's sep_conv
two, dil_conv one, the spike-native ops a neuron before every conv, pools and skip_connect none), and ``none`` carries
no signal at all, so no path runs through it.

Under α the cell is random, and its longest chain is made smooth so that α gets a gradient (:func:`cell_depth`): an
edge deploys each of its ops with its probability given that the edge is not ``none`` (its chain is the expected
one), and is among the two edges its node keeps about as often as its share of the node's non-``none`` mass; a
node's depth is a soft maximum over its edges, the cell's over its output nodes. The engine adds
``latency_weight · E_α / E_uniform`` to the α loss (like the energy term, so the weight is unitless).

The value ranks cells by the steps their chains may cost; it is not the SNN's measured steps to silence, which are
fewer (a neuron starts to fire before its input has settled). The stem and each cell's preprocessing neuron are left
out: they are the same for every α.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from kernels.st_bif import level_bounds
from search_space.cell import edge_stride
from search_space.neurons import NEURON_KINDS, neuron_parameters
from search_space.ops import OPS
from search_space.space import SearchSpace

NONE_OP = "none"
# Depths come in whole neurons. A soft maximum at half a neuron stays within a fraction of a neuron of the longest
# chain, yet still gives the chains one neuron shorter (the next to become the longest) some of the gradient.
DEPTH_TEMPERATURE = 0.5
# The input edges a derived cell keeps per node (DARTS's rule, aso_se.search.derive).
KEPT_EDGES = 2


@functools.lru_cache(maxsize=None)
def neurons_chained(op: str, stride: int) -> int:
    """The neurons a signal crosses one after another in ``op`` (on an edge of ``stride``): the neurons its builder
    asks for, since every registered op applies its neurons in sequence (a skip at stride 2 is a FactorizedReduce,
    one neuron). Built once per (op, stride) with placeholder neurons."""
    built = 0

    def placeholder() -> nn.Module:
        nonlocal built
        built += 1
        return nn.Identity()

    OPS[op](2, stride, False, placeholder)
    return built


def steps_per_neuron(neuron: Callable[[], nn.Module]) -> int:
    """The steps a binary neuron of the factory ``neuron`` may need to emit its count: the largest count its levels
    hold (``kernels.st_bif.level_bounds``); 1 for neurons without levels (LIF, ReLU), where a chain counts layers."""
    kind = getattr(neuron, "kind", None)
    if kind not in NEURON_KINDS:
        return 1
    params = {**neuron_parameters(kind), **getattr(neuron, "params", {})}
    if params.get("level") is None:
        return 1
    pos_max, neg_min = level_bounds(params["level"], bool(params.get("sym", False)))
    return max(pos_max, -neg_min)


@dataclass(frozen=True)
class CellChains:
    """What the latency of a search space's cells is made of: the neurons each op chains on each edge of each cell
    type (``[cell types, edges, ops]``, normal then reduce), which ops carry a signal (all but ``none``), the cell's
    shape and the steps each neuron costs."""

    neurons: Tensor
    carries: Tensor
    steps: int
    multiplier: int
    steps_per_neuron: int

    @classmethod
    def of(cls, space: SearchSpace, steps_per_neuron: int = 1) -> CellChains:
        inputs = [state for node in range(space.steps) for state in range(2 + node)]  # the state each edge reads
        neurons = torch.tensor([[[float(neurons_chained(op, edge_stride(reduction, state))) for op in space.primitives]
                                 for state in inputs] for reduction in (False, True)], dtype=torch.float64)
        carries = torch.tensor([op != NONE_OP for op in space.primitives]).expand_as(neurons).contiguous()
        return cls(neurons, carries, space.steps, space.multiplier, steps_per_neuron)

    def to(self, like: Tensor) -> CellChains:
        """On ``like``'s device, the neurons in its dtype: no copy from the host at each step."""
        return replace(self, neurons=self.neurons.to(like), carries=self.carries.to(like.device))


def _soft_max(values: Tensor, weights: Tensor, temperature: float) -> Tensor:
    """``τ · log Σ weights · exp(values / τ)`` over the last dimension: the maximum of the values whose weight is not
    zero, within ``τ · log Σ weights`` (τ = 0: exactly that maximum). ``-inf`` where no value has a weight (no path);
    no NaN reaches the gradient there."""
    present = (weights > 0) & (values > -math.inf)
    masked = values.masked_fill(~present, -math.inf)
    if temperature == 0:
        return masked.amax(dim=-1)
    any_present = present.any(dim=-1)
    top = masked.amax(dim=-1).detach().masked_fill(~any_present, 0.0)  # for a stable exp
    scaled = torch.exp((values.masked_fill(~present, 0.0) - top.unsqueeze(-1)) / temperature) * present
    total = (weights * scaled).sum(dim=-1)
    safe = torch.where(any_present, total, torch.ones_like(total))
    return torch.where(any_present, top + temperature * torch.log(safe), torch.full_like(total, -math.inf))


def _nonzero(divisor: Tensor) -> Tensor:
    """``divisor`` with its zeros (a node or edge without a signal, whose numerator is zero too) set to one."""
    return torch.where(divisor > 0, divisor, torch.ones_like(divisor))


def cell_depth(logits: Tensor, chains: CellChains, temperature: float = DEPTH_TEMPERATURE) -> Tensor:
    """``[cell types]`` neurons on the longest chain from a cell input to the cell output, expected under softmax of
    ``logits`` (``[cell types, edges, ops]``, ``-inf``: pruned), smoothed by ``temperature`` (see the module
    docstring; 0: the exact longest chain where α is one op per edge and ``none`` on the edges a node does not keep).
    """
    neurons = chains.neurons.to(logits)
    carries = chains.carries.to(logits.device)
    probs = torch.softmax(logits, dim=-1) * carries  # the ops that carry a signal
    signal = probs.sum(dim=-1)  # [types, edges]: the odds that an edge is not none
    edge_neurons = (probs * neurons).sum(dim=-1) / _nonzero(signal)
    depths = [logits.new_zeros(logits.shape[0])] * 2  # the cell's inputs, after its preprocessing
    start = 0
    for node in range(chains.steps):
        edges = slice(start, start + 2 + node)
        reach = torch.stack(depths, dim=-1) + edge_neurons[:, edges]
        odds = signal[:, edges]
        if 2 + node <= KEPT_EDGES:  # every edge that carries a signal is kept
            kept = (odds > 0).to(odds.dtype)
        else:  # kept about as often as its share of the node's signal
            kept = KEPT_EDGES * odds / _nonzero(odds.sum(dim=-1, keepdim=True))
        depths.append(_soft_max(reach, kept, temperature))
        start += 2 + node
    outputs = torch.stack(depths[-chains.multiplier:], dim=-1)
    depth = _soft_max(outputs, torch.ones_like(outputs), temperature)
    return depth.clamp_min(0.0)  # a cell whose every output node is cut off adds no steps


def expected_latency(logits: Tensor, chains: CellChains, cells: Sequence[int],
                     temperature: float = DEPTH_TEMPERATURE) -> Tensor:
    """Steps the cells add along the network's chain of ``cells[t]`` cells of each type (the supernet's), each as
    deep as :func:`cell_depth`: the part of the SNN's latency that α chooses (stem and preprocessing are the same for
    every α)."""
    depth = cell_depth(logits, chains, temperature)
    return sum(count * depth[kind] for kind, count in enumerate(cells)) * chains.steps_per_neuron


def uniform_latency(logits: Tensor, chains: CellChains, cells: Sequence[int],
                    temperature: float = DEPTH_TEMPERATURE) -> Tensor:
    """:func:`expected_latency` when every unpruned op of an edge is equally likely (the latency term's unit)."""
    uniform = torch.zeros_like(logits).masked_fill(~torch.isfinite(logits), -math.inf)
    return expected_latency(uniform, chains, cells, temperature)


def cells_per_type(kinds: Sequence[str]) -> tuple[int, int]:
    """(normal, reduce) cells of a supernet structure's kinds; a grown cell is a normal one (it uses normal α)."""
    reductions = sum(kind == "reduction" for kind in kinds)
    return len(kinds) - reductions, reductions
