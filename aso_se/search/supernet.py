"""The supernet searched by ASO-SE: DARTS's search network with FastMixedOp edges.

Layout as DARTS's ``model_search.Network``: a stem, ``layers`` cells (reductions at 1/3 and 2/3 of
the depth), global pooling, a linear classifier; node i of a cell reads all 2 + i earlier states
through one FastMixedOp edge each, in DARTS's edge order. Ops come from ``search_space.ops.OPS`` with
``affine=False`` BatchNorms, as DARTS. Tensors are flattened over time, ``[T*B, C, H, W]``.
Grown cells (``aso_se.search.growth``) output ``s1 + gate * cell(s0, s1)`` with ``gate`` starting at 0
and pass ``s0`` through, so the next cell sees exactly the inputs it saw before the growth.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Sequence

import torch
from torch import Tensor, nn

from aso_se.search.arch_params import (
    ARGMAX,
    ArchSample,
    BatchedArchitectureUpdate,
    PendingDraw,
    SamplingConfig,
    active_weights,
    start_draw,
)
from aso_se.search.graphed_ops import OpGraphs
from aso_se.search.mixed_op import FastMixedOp, weighted_sum
from aso_se.search.op_runner import EAGER, OpRunner
from aso_se.search.recompute import RecomputedCell
from search_space.cell import CellLayout, cell_layouts, cell_preprocessing, edge_stride, reduction_indices
from search_space.errors import UserInputError
from search_space.multistep import Stem, mean_over_time
from search_space.ops import OPS
from search_space.space import SearchSpace

CellKind = Literal["normal", "reduction", "grown"]
CELL_TYPES: tuple[str, str] = ("normal", "reduce")  # the two α sets, in the order samples are drawn


@dataclass(frozen=True)
class SupernetStructure:
    """What growth changes: the base channel count and the kind of every cell, in order."""

    channels: int
    cells: tuple[CellKind, ...]

    @classmethod
    def initial(cls, channels: int, layers: int) -> SupernetStructure:
        """DARTS's layout: reduction cells at layers // 3 and 2 * layers // 3."""
        if layers < 1 or channels < 2 or channels % 2:
            raise UserInputError(
                f"supernet channels={channels}, layers={layers}: need an even channels >= 2 and layers >= 1; "
                "fix search.supernet.channels / search.supernet.layers"
            )
        reductions = reduction_indices(layers)
        return cls(channels, tuple("reduction" if i in reductions else "normal" for i in range(layers)))

    def to_dict(self) -> dict[str, object]:
        return {"channels": self.channels, "cells": list(self.cells)}

    @classmethod
    def from_dict(cls, fields: dict[str, object]) -> SupernetStructure:
        return cls(int(fields["channels"]), tuple(fields["cells"]))


@dataclass(frozen=True)
class NodeTerms:
    """What one node of a cell computes: ``sum(w * edges[e].ops[o](states[s]))`` over its ``inputs``
    ``(e, s, ops)`` and each ``o`` of their ``ops``, with the ``w`` of ``weights`` in that order (``node_terms``)."""

    inputs: tuple[tuple[int, int, tuple[int, ...]], ...]
    weights: Tensor

    @property
    def terms(self) -> tuple[tuple[int, int, int], ...]:
        """``(e, s, o)`` of every term, in ``weights``' order."""
        return tuple((edge, state, op) for edge, state, ops in self.inputs for op in ops)


def node_terms(
    edge_weights: Tensor, sample: ArchSample, steps: int, none_op: int | None
) -> list[NodeTerms]:
    """Each node's terms for one cell type: every active op of each of its edges, ``none`` left out.

    ``edge_weights``: ``[edges, ops]`` (``BatchedArchitectureUpdate.edge_weights``). ``none`` adds
    ``w * 0`` (no value, a zero gradient), so it is dropped, unless it is all a node has: then the
    first such term stays, and the node is its zeros, as DARTS's MixedOp would give.
    """
    per_edge = active_weights(edge_weights, sample)
    nodes, offset = [], 0
    for node in range(steps):
        candidates = [
            (offset + state, state, op, weight)
            for state in range(2 + node)
            for op, weight in zip(sample.active_ops[offset + state], per_edge[offset + state])
        ]
        kept = [term for term in candidates if term[2] != none_op] or candidates[:1]
        inputs: list[tuple[int, int, tuple[int, ...]]] = []
        for edge, state, op, _ in kept:  # kept terms of one edge are adjacent
            if inputs and inputs[-1][0] == edge:
                inputs[-1] = (edge, state, (*inputs[-1][2], op))
            else:
                inputs.append((edge, state, (op,)))
        nodes.append(NodeTerms(tuple(inputs), torch.stack([term[3] for term in kept])))
        offset += 2 + node
    return nodes


class SearchCell(nn.Module):
    """One supernet cell: preprocessing, ``steps`` nodes summing FastMixedOp edges, last ``multiplier`` nodes out."""

    def __init__(
        self, search_space: SearchSpace, layout: CellLayout, *, grown: bool, neuron: Callable[[], nn.Module]
    ) -> None:
        super().__init__()
        self.steps, self.multiplier = search_space.steps, search_space.multiplier
        self.preprocess0, self.preprocess1 = cell_preprocessing(layout, neuron=neuron, affine=False)
        self.edges = nn.ModuleList(
            FastMixedOp(
                OPS[name](layout.C, edge_stride(layout.reduction, j), False, neuron) for name in search_space.primitives
            )
            for i in range(self.steps)
            for j in range(2 + i)
        )
        # A grown cell starts as the identity on s1 (see the module docstring).
        self.gate = nn.Parameter(torch.zeros(())) if grown else None

    def forward(self, s0: Tensor, s1: Tensor, nodes: Sequence[NodeTerms], run: OpRunner = EAGER) -> Tensor:
        """DARTS's cell on the sampled ops: node ``j`` sums ``w * op(states[i])`` over its edges ``i -> j`` and
        their active ops (``nodes``, from ``node_terms``), all at once; the cell outputs the last ``multiplier``
        nodes. ``run`` calls every op: eagerly, or from its CUDA graphs (``aso_se.search.op_runner``)."""
        cell = id(self)
        states = [run((cell, "pre0"), (cell, "s0"), self.preprocess0, s0),
                  run((cell, "pre1"), (cell, "s1"), self.preprocess1, s1)]
        for node in nodes:
            terms = [term for edge, state, ops in node.inputs
                     for term in self.edges[edge](states[state], ops, run, slot=(cell, edge), source=(cell, state))]
            # Training: computed into the memory the graphed ops read this state from (no copy into it).
            out = run.state_buffer((cell, len(states))) if self.training else None
            states.append(weighted_sum([term.value for term in terms], node.weights,
                                       grad_buffers=[term.grad_buffer for term in terms], out=out))
        out = torch.cat(states[-self.multiplier:], dim=1)
        return out if self.gate is None else s1 + self.gate * out


def num_edges(steps: int) -> int:
    """Edges of a cell with ``steps`` intermediate nodes: node i reads 2 + i states."""
    return sum(2 + i for i in range(steps))


class SearchNetwork(nn.Module):
    """The supernet. ``forward(x, samples)`` runs each edge's sampled ops (``aso_se.search.arch_params``).

    ``x`` is a static image batch ``[B, C, H, W]`` (direct encoding over T) or time-first DVS
    frames ``[T, B, C, H, W]`` (``search_space.multistep.Stem``); the classifier reads the
    pooled features averaged over T (= the T-averaged logits, the classifier being linear). α lives in
    ``arch["normal"]`` and ``arch["reduce"]`` (one ``[edges, ops]`` Parameter each).
    """

    def __init__(
        self, structure: SupernetStructure, *, search_space: SearchSpace, neuron: Callable[[], nn.Module],
        num_classes: int, in_channels: int = 3, timesteps: int = 1, stem_multiplier: int = 3,
        recompute: bool = False,
    ) -> None:
        super().__init__()
        self.structure = structure
        self.search_space = search_space
        self._neuron = neuron
        self.num_classes, self.in_channels, self.timesteps = num_classes, in_channels, timesteps
        self.stem_multiplier = stem_multiplier
        C_stem = stem_multiplier * structure.channels
        self.stem = Stem(in_channels, C_stem, timesteps)
        multiplier = search_space.multiplier
        layouts = cell_layouts(len(structure.cells), structure.channels, C_stem, normal_multiplier=multiplier,
                               reduce_multiplier=multiplier, kinds=structure.cells)
        self.cells = nn.ModuleList()
        for position, (kind, layout) in enumerate(zip(structure.cells, layouts)):
            if kind == "grown" and (position == 0 or layout.C_prev != multiplier * layout.C):
                raise UserInputError(
                    f"supernet structure {structure.cells}: a grown cell at {position} must follow a cell "
                    "of its stage (it adds to that cell's output); fix the structure in the checkpoint"
                )
            cell = SearchCell(search_space, layout, grown=kind == "grown", neuron=neuron)
            self.cells.append(RecomputedCell(cell, enabled=recompute))
        C_prev = multiplier * layouts[-1].C  # a grown last cell keeps its stage's width
        self.classifier = nn.Linear(C_prev, num_classes)
        edges = num_edges(search_space.steps)
        self.arch = nn.ModuleDict(
            {kind: BatchedArchitectureUpdate(edges, search_space.primitives) for kind in CELL_TYPES}
        )
        self.op_graphs: OpGraphs | None = None

    @property
    def neuron(self) -> Callable[[], nn.Module]:
        """The factory of every neuron in the ops (what the latency term reads the neurons' levels from)."""
        return self._neuron

    def use_op_graphs(self, enabled: bool) -> None:
        """Training forwards on CUDA replay each op from CUDA graphs (``aso_se.search.graphed_ops``), or not."""
        self.op_graphs = OpGraphs() if enabled else None

    @property
    def op_runner(self) -> OpRunner:
        """What runs the ops: the op graphs, unless off or cells are recomputed (a recomputation in backward
        would run a graph twice in one pass), else the eager runner."""
        return EAGER if self.op_graphs is None or self.recompute else self.op_graphs

    @property
    def recompute(self) -> bool:
        """Whether the cells' activations are recomputed in backward instead of stored (``recompute.py``)."""
        return all(cell.enabled for cell in self.cells)

    @recompute.setter
    def recompute(self, enabled: bool) -> None:
        for cell in self.cells:
            cell.enabled = enabled

    def with_structure(self, structure: SupernetStructure) -> SearchNetwork:
        """A new, freshly initialized supernet like this one but with ``structure`` (same device and dtype)."""
        return SearchNetwork(
            structure, search_space=self.search_space, neuron=self._neuron, num_classes=self.num_classes,
            in_channels=self.in_channels, timesteps=self.timesteps, stem_multiplier=self.stem_multiplier,
            recompute=self.recompute,
        ).to(self.classifier.weight)

    def arch_parameters(self) -> list[nn.Parameter]:
        return [self.arch[kind].alpha for kind in CELL_TYPES]

    def arch_logits(self) -> Tensor:
        """``[cell types, edges, ops]`` α with ``-inf`` for pruned ops (``BatchedArchitectureUpdate.logits``)."""
        return torch.stack([self.arch[kind].logits() for kind in CELL_TYPES])

    def alpha_probabilities(self) -> dict[str, Tensor]:
        """``{"normal": [edges, ops], "reduce": [edges, ops]}`` softmax of α on the CPU (columns: the primitives)."""
        with torch.no_grad():
            return {kind: self.arch[kind].probabilities().float().cpu() for kind in CELL_TYPES}

    def weight_parameters(self) -> Iterator[nn.Parameter]:
        return (p for name, p in self.named_parameters() if not name.startswith("arch."))

    def draw(self, num_samples: int, sampling: SamplingConfig, *, temperature: float,
             generator: torch.Generator | None = None) -> list[list[ArchSample]]:
        """``num_samples`` draws for both cell types, one host sync (``aso_se.search.arch_params.draw_samples``)."""
        return self.start_draw(num_samples, sampling, temperature=temperature, generator=generator).samples()

    def start_draw(self, num_samples: int, sampling: SamplingConfig, *, temperature: float,
                   generator: torch.Generator | None = None) -> PendingDraw:
        """``draw`` queued without waiting; ``.samples()`` of the result gives the same samples."""
        archs = [self.arch[kind] for kind in CELL_TYPES]
        return start_draw(archs, num_samples, sampling, temperature=temperature, generator=generator)

    def argmax_sample(self) -> list[ArchSample]:
        """Every edge's most likely op alone, with weight 1 (eval: the supernet's single best path)."""
        return self.draw(1, ARGMAX, temperature=1.0)[0]

    def forward(self, x: Tensor, samples: Sequence[ArchSample] | None = None, *, arch_grad: bool = True) -> Tensor:
        """Logits ``[B, classes]``. ``samples``: one ArchSample per cell type (``draw``); None = ``argmax_sample()``.

        ``arch_grad=False`` detaches α (weight steps): the edge weights carry no graph to α.
        """
        if samples is None:
            samples = self.argmax_sample()
        primitives = self.search_space.primitives
        none_op = primitives.index("none") if "none" in primitives else None
        nodes = {
            kind: node_terms(self.arch[kind].edge_weights(sample, arch_grad=arch_grad), sample,
                             self.search_space.steps, none_op)
            for kind, sample in zip(CELL_TYPES, samples)
        }
        run = self.op_runner
        run.begin_pass()
        s0 = s1 = self.stem(x)
        for wrapper, kind in zip(self.cells, self.structure.cells):
            out = wrapper(s0, s1, nodes["reduce" if kind == "reduction" else "normal"], run)
            s0, s1 = (s0, out) if kind == "grown" else (s1, out)
        features = mean_over_time(s1.mean(dim=(2, 3)), self.timesteps)
        return self.classifier(features)


def build_supernet(
    *, search_space: SearchSpace, neuron: Callable[[], nn.Module], channels: int, layers: int, num_classes: int,
    in_channels: int = 3, timesteps: int = 1, stem_multiplier: int = 3, recompute: bool = False,
    checkpointing: bool | None = None,
) -> SearchNetwork:
    """The initial supernet (DARTS's layout with ``channels`` and ``layers``), for Hydra's ``_target_``.

    ``checkpointing``: ``recompute``'s name in the configs that checkpoints saved before it was renamed
    (a resumed search builds its supernet from its checkpoint's config)."""
    if checkpointing is not None:
        recompute = checkpointing
    return SearchNetwork(
        SupernetStructure.initial(channels, layers), search_space=search_space, neuron=neuron,
        num_classes=num_classes, in_channels=in_channels, timesteps=timesteps, stem_multiplier=stem_multiplier,
        recompute=recompute,
    )
