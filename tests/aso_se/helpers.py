"""Shared tiny pieces for the engine tests (CPU, seconds): supernets, engines, draws."""
from __future__ import annotations

import functools
import math
from typing import Any

import torch

from aso_se.search.arch_params import ArchSample, SamplingConfig
from aso_se.search.engine import ASOSEEngine, SearchLoopCallbacks
from aso_se.search.evolution import CycleResult, EvolutionConfig
from aso_se.search.schedule import SearchSchedule
from aso_se.search.supernet import SearchNetwork, build_supernet
from search_space.neurons import NeuronFactory
from search_space.space import SearchSpace

SMALL_SPACE = SearchSpace(
    ("none", "max_pool_3x3", "skip_connect", "sep_conv_3x3", "dil_conv_3x3"), steps=2, multiplier=2
)


def tiny_supernet(
    neuron: str = "st_bif", *, timesteps: int = 2, space: SearchSpace = SMALL_SPACE, channels: int = 4,
    layers: int = 3, in_channels: int = 1, recompute: bool = False, seed: int = 0,
) -> SearchNetwork:
    torch.manual_seed(seed)
    return build_supernet(
        search_space=space, neuron=NeuronFactory(neuron, timesteps=timesteps), channels=channels, layers=layers,
        num_classes=10, in_channels=in_channels, timesteps=timesteps, recompute=recompute,
    )


def darts_optimizers() -> dict[str, functools.partial]:
    """DARTS's search optimizers (a larger α lr so that a few steps move α)."""
    return {
        "weights_optimizer": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=3e-4),
        "arch_optimizer": functools.partial(torch.optim.Adam, lr=3e-2, betas=(0.5, 0.999), weight_decay=1e-3),
    }


def sample_ops(supernet: SearchNetwork, k: int | None, seed: int | None = 0) -> list[ArchSample]:
    """One draw of ``k`` ops per edge for both cell types (no Gumbel noise when ``seed`` is None)."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return supernet.draw(1, SamplingConfig(k=k, gumbel=seed is not None), temperature=1.0, generator=generator)[0]


# The plan and evolution the engine tests were written for: no pruning, no caps on growth.
TEST_SCHEDULE = SearchSchedule(cycles=2, warmup_epochs=1, search_epochs=2, restabilize_epochs=1)
TEST_EVOLUTION = EvolutionConfig(max_cells=None, max_channels=None, prune_threshold=0.0)


def make_engine(supernet: SearchNetwork, **kwargs) -> ASOSEEngine:
    return ASOSEEngine(supernet, **{**darts_optimizers(), "schedule": TEST_SCHEDULE, "evolution": TEST_EVOLUTION,
                                    **kwargs})


class Recorder(SearchLoopCallbacks):
    """Callbacks that keep what the engine reports: each step's metrics, each epoch's summary, each cycle's result."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.epochs: list[dict[str, Any]] = []
        self.cycles: list[CycleResult] = []

    def on_log(self, scalars: dict[str, Any], step: int) -> None:
        self.steps.append(scalars)

    def on_epoch_end(self, summary: dict[str, Any]) -> None:
        self.epochs.append(summary)

    def on_cycle_end(self, result: CycleResult) -> None:
        self.cycles.append(result)


def central_differences(function, values: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """d function / d values by central differences, entry by entry (``-inf`` entries, pruned ops: 0)."""
    grad = torch.zeros_like(values)
    for index in zip(*torch.nonzero(torch.isfinite(values), as_tuple=True)):
        saved = values[index].item()
        values[index] = saved + eps
        above = function(values).item()
        values[index] = saved - eps
        below = function(values).item()
        values[index] = saved
        grad[index] = (above - below) / (2 * eps)
    return grad


def random_logits(seed: int) -> torch.Tensor:
    """``[cell types, edges, ops]`` float64 α of SMALL_SPACE's cells, two ops pruned (``-inf``)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 5, 5, dtype=torch.float64, generator=generator)
    logits[0, 3, 1] = logits[1, 0, 4] = -math.inf  # pruned ops
    return logits
