"""Genotype derivation: DARTS's rule, the skip_connect cap."""
from __future__ import annotations

import pytest
import torch

from aso_se.search.derive import derive_cell, derive_genotype
from search_space.genotypes import Genotype
from search_space.network import build_network
from search_space.neurons import NeuronFactory
from search_space.ops import DARTS_PRIMITIVES


def darts_parse(weights: list[list[float]], primitives: tuple[str, ...], steps: int) -> list[tuple[str, int]]:
    """quark0/darts model_search.Network.genotype()._parse, as written there."""
    gene, n, start = [], 2, 0
    for i in range(steps):
        end = start + n
        W = weights[start:end]
        edges = sorted(
            range(i + 2), key=lambda x: -max(W[x][k] for k in range(len(W[x])) if k != primitives.index("none"))
        )[:2]
        for j in edges:
            k_best = None
            for k in range(len(W[j])):
                if k != primitives.index("none"):
                    if k_best is None or W[j][k] > W[j][k_best]:
                        k_best = k
            gene.append((primitives[k_best], j))
        start = end
        n += 1
    return gene


@pytest.mark.parametrize("seed", range(5))
def test_derivation_is_darts_rule(seed: int) -> None:
    probs = torch.softmax(torch.randn(14, 8, generator=torch.Generator().manual_seed(seed)), dim=-1)
    expected = darts_parse(probs.tolist(), DARTS_PRIMITIVES, 4)
    assert list(derive_cell(probs, DARTS_PRIMITIVES, 4, max_skip_connect=None)) == expected


def test_skip_connect_cap_replaces_the_weakest_skips() -> None:
    skip = DARTS_PRIMITIVES.index("skip_connect")
    probs = torch.full((14, 8), 0.01)
    probs[:, skip] = torch.linspace(0.9, 0.5, 14)  # skip_connect wins every edge, weaker and weaker
    probs[:, DARTS_PRIMITIVES.index("sep_conv_3x3")] = 0.2
    uncapped = derive_cell(probs, DARTS_PRIMITIVES, 4, max_skip_connect=None)
    capped = derive_cell(probs, DARTS_PRIMITIVES, 4, max_skip_connect=2)
    assert [op for op, _ in uncapped].count("skip_connect") == 8
    ops = [op for op, _ in capped]
    assert ops.count("skip_connect") == 2 and ops.count("sep_conv_3x3") == 6
    # the two kept skips are the strongest chosen ones: node 0's edges 0 and 1
    assert capped[:2] == (("skip_connect", 0), ("skip_connect", 1))


def test_derived_genotype_builds_a_network() -> None:
    probs = [torch.softmax(torch.randn(14, 8), dim=-1) for _ in range(2)]
    genotype = derive_genotype(*probs, DARTS_PRIMITIVES, steps=4, multiplier=4, max_skip_connect=2)
    assert isinstance(genotype, Genotype) and genotype.normal_concat == (2, 3, 4, 5)
    assert all(op != "none" for op, _ in genotype.normal + genotype.reduce)
    network = build_network(genotype, neuron=NeuronFactory("relu", timesteps=1), channels=4, layers=3, num_classes=10)
    assert network(torch.randn(2, 3, 32, 32))[0].shape == (2, 10)
