"""TensorBoard output of a run: scalars, α heatmaps, cell diagrams, firing rates, conv paths.

The entry point creates one `TensorBoardLogger` per run (rank 0 only) under ``<run_dir>/tb`` and
passes it down. Figures are drawn with matplotlib's object API (no pyplot state, no graphviz).
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from search_space.errors import UserInputError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from search_space.genotypes import Genotype


def _new_figure(**kwargs: object) -> Figure:
    """A matplotlib figure (imported here: only the processes that draw pay for matplotlib)."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


# A DARTS cell: two input states, then intermediate nodes that each read every earlier state.
_INPUT_NAMES = ("c_{k-2}", "c_{k-1}")


class TensorBoardLogger:
    """One SummaryWriter for the run plus the figures and groupings this project logs."""

    def __init__(self, log_dir: str | Path, *, purge_step: int | None = None,
                 flush_secs: int = 30, alpha_figure_every_n_epochs: int = 1) -> None:
        if alpha_figure_every_n_epochs < 1:  # before the writer: a refused setting leaves no event file
            raise UserInputError(f"logger.alpha_figure_every_n_epochs={alpha_figure_every_n_epochs}: need an int >= 1 "
                                 f"(1: α heatmaps at every epoch's end)")
        self.alpha_figure_every_n_epochs = alpha_figure_every_n_epochs
        # purge_step drops events a killed run wrote after its last checkpoint, so a resumed
        # run's curves continue without a doubled segment.
        from torch.utils.tensorboard import SummaryWriter  # here: every process imports this module, few log

        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step, flush_secs=flush_secs)

    def alpha_figure_due(self, epoch: int) -> bool:
        """Whether the epoch-end α heatmaps of 0-based ``epoch`` are drawn: drawing costs rank 0 about a
        second of host time, which the other ranks of a short multi-GPU epoch wait for."""
        return (epoch + 1) % self.alpha_figure_every_n_epochs == 0

    def scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        for name, value in values.items():
            self.writer.add_scalar(f"{prefix}/{name}", value, step)

    def alphas(self, alphas: Mapping[str, torch.Tensor], primitives: Sequence[str],
               step: int) -> None:
        """One heatmap per cell type of the ``[edges, ops]`` architecture distribution."""
        for cell_type, weights in alphas.items():
            figure = alpha_heatmap(weights, primitives, title=f"{cell_type} cell α (softmax)")
            self.writer.add_figure(f"alpha/{cell_type}", figure, step)

    def genotype(self, genotype: Genotype, step: int) -> None:
        """The genotype drawn as two cell diagrams, and as JSON text."""
        for cell_type in ("normal", "reduce"):
            figure = cell_diagram(getattr(genotype, cell_type),
                                  getattr(genotype, f"{cell_type}_concat"),
                                  title=f"{cell_type} cell")
            self.writer.add_figure(f"genotype/{cell_type}", figure, step)
        # Indented text renders as a code block in TensorBoard's markdown.
        text = "\n".join(f"    {line}" for line in genotype.to_json().splitlines())
        self.writer.add_text("genotype", text, step)

    def curve(self, tag: str, xs: Sequence[float], ys: Sequence[float], step: int, *, xlabel: str,
              ylabel: str) -> None:
        """A y-over-x line plot as a figure (scalars at x would collide with the run's global steps)."""
        figure = _new_figure(figsize=(4, 3))
        axes = figure.add_subplot()
        axes.plot(list(xs), list(ys), marker="o")
        axes.set_xscale("log", base=2)
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        figure.tight_layout()
        self.writer.add_figure(tag, figure, step)

    def firing_rates(self, rates: Mapping[str, float], step: int) -> None:
        """Per layer (cell, stem, head), a histogram of its neurons' firing rates and their mean.

        Each neuron module reports one rate (the fraction of its neuron-steps that spiked), so
        a layer's histogram shows how the rates of the neurons inside it spread.
        """
        if not rates:
            return
        grouped: dict[str, list[float]] = defaultdict(list)
        for name, rate in rates.items():
            grouped[layer_of(name)].append(rate)
        for layer, layer_rates in grouped.items():
            self.writer.add_histogram(f"firing_rate/{layer}", torch.tensor(layer_rates), step)
            self.writer.add_scalar(f"firing_rate_mean/{layer}",
                                   sum(layer_rates) / len(layer_rates), step)
        self.writer.add_histogram("firing_rate/all", torch.tensor(list(rates.values())), step)

    def sparse_conv_paths(self, counters: Mapping[str, int], step: int) -> None:
        """How many convolution calls took each path of the sparse-conv dispatcher."""
        for path, count in counters.items():
            self.writer.add_scalar(f"sparse_conv/{path}", count, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def layer_of(module_name: str) -> str:
    """``cells.3.edges.2.op.1`` → ``cells.3``: up to the first index, else the first name."""
    parts = module_name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return parts[0]


def _state_name(index: int) -> str:
    return _INPUT_NAMES[index] if index < len(_INPUT_NAMES) else str(index - len(_INPUT_NAMES))


def edge_labels(num_edges: int) -> list[str]:
    """DARTS's edge order: node i reads states 0..i+1 (two inputs, then earlier nodes)."""
    # Solve num_edges = sum_{i<steps} (2 + i) = steps * (steps + 3) / 2 for steps.
    steps = round((-3 + math.sqrt(9 + 8 * num_edges)) / 2)
    if steps * (steps + 3) // 2 != num_edges:
        raise ValueError(f"{num_edges} edges is not a DARTS cell (2 + i inputs for node i)")
    return [f"{_state_name(j)} → {i}" for i in range(steps) for j in range(2 + i)]


def alpha_heatmap(weights: torch.Tensor, primitives: Sequence[str], *, title: str) -> Figure:
    """Edges as rows, ops as columns, each cell annotated with its probability."""
    probs = weights.detach().float().cpu()
    edges, ops = probs.shape
    figure = _new_figure(figsize=(1.1 * ops + 2.5, 0.38 * edges + 1.5), dpi=90)
    ax = figure.add_subplot()
    image = ax.imshow(probs.numpy(), cmap="viridis", vmin=0.0, vmax=max(float(probs.max()), 1e-6),
                      aspect="auto")
    ax.set_xticks(range(ops), labels=list(primitives), rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(edges), labels=edge_labels(edges), fontsize=8)
    for e in range(edges):
        for o in range(ops):
            value = float(probs[e, o])
            ax.text(o, e, f"{value:.2f}", ha="center", va="center", fontsize=6,
                    color="black" if value > 0.6 * float(probs.max()) else "white")
    ax.set_title(title)
    figure.colorbar(image, ax=ax, fraction=0.04)
    figure.tight_layout()
    return figure


def cell_diagram(edges: Sequence[tuple[str, int]], concat: Sequence[int], *,
                 title: str) -> Figure:
    """A left-to-right drawing of a genotype cell: inputs, intermediate nodes, output concat."""
    steps = len(edges) // 2
    # Inputs on the left, nodes on a zigzag so that straight edges rarely cross a node.
    positions = {0: (0.0, 1.0), 1: (0.0, -1.0)}
    for node in range(steps):
        positions[node + 2] = (2.0 + 2.0 * node, (0.45 if node % 2 == 0 else -0.45))
    output = (2.0 + 2.0 * steps, 0.0)
    figure = _new_figure(figsize=(2.2 + 2.0 * steps, 3.4), dpi=90)
    ax = figure.add_subplot()
    for state in concat:
        _arrow(ax, positions[state], output, label="", color="0.65")
    for k, (op, source) in enumerate(edges):
        _arrow(ax, positions[source], positions[k // 2 + 2], label=op, color="0.15")
    for state, (x, y) in positions.items():
        _node(ax, x, y, _state_name(state), "#9ecae1" if state < 2 else "#fdd0a2")
    _node(ax, *output, "c_{k}", "#a1d99b")
    ax.set_xlim(-0.7, output[0] + 0.7)
    ax.set_ylim(-1.4, 1.4)
    ax.set_axis_off()
    ax.set_title(title)
    figure.tight_layout()
    return figure


def _node(ax: Axes, x: float, y: float, text: str, color: str) -> None:
    ax.text(x, y, text, ha="center", va="center", fontsize=9, zorder=3,
            bbox={"boxstyle": "round,pad=0.35", "facecolor": color, "edgecolor": "0.3"})


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], *, label: str,
           color: str) -> None:
    ax.annotate("", xy=end, xytext=start, zorder=1,
                arrowprops={"arrowstyle": "-|>", "color": color, "shrinkA": 14, "shrinkB": 14})
    if label:  # near the head, so that edges into the same node keep their labels apart
        x = start[0] + 0.62 * (end[0] - start[0])
        y = start[1] + 0.62 * (end[1] - start[1])
        ax.text(x, y, label, ha="center", va="center", fontsize=7, zorder=2,
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none",
                      "alpha": 0.9})
