"""Genotype derivation: DARTS's rule and its caps (skip_connect, parameter-free ops, the normal cell's pools)."""
from __future__ import annotations

import pytest
import torch

from aso_se.search.derive import derive_cell, derive_genotype
from aso_se.search.evolution import EvolutionConfig
from search_space.errors import UserInputError
from search_space.genotypes import Genotype
from search_space.network import build_network
from search_space.neurons import NeuronFactory
from search_space.ops import DARTS_PRIMITIVES, OPS, PARAMETER_FREE_OPS, POOL_OPS


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


def test_parameter_free_ops_are_the_ops_without_weights_on_a_normal_edge() -> None:
    neuron = NeuronFactory("st_bif_qann", timesteps=1)
    weightless = {name for name in OPS if name != "none" and not any(
        isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) or getattr(m, "affine", False)
        for m in OPS[name](4, 1, True, neuron).modules())}
    assert weightless == PARAMETER_FREE_OPS


def test_parameter_free_cap_replaces_the_weakest_pools_and_skips() -> None:
    """A cell of pools and skips (the short proxies' favourite): capped at 3, the 3 strongest stay and the other
    edges take their best weighted op (the skip cap of 2 is met all along)."""
    probs = torch.full((14, 8), 0.01)
    strengths = torch.linspace(0.9, 0.5, 14)
    for i, name in enumerate(("max_pool_3x3", "avg_pool_3x3", "skip_connect")):  # each edge's winner a free op
        probs[i::3, DARTS_PRIMITIVES.index(name)] = strengths[i::3]
    probs[:, DARTS_PRIMITIVES.index("dil_conv_3x3")] = 0.2
    uncapped = derive_cell(probs, DARTS_PRIMITIVES, 4, max_skip_connect=None)
    assert all(op in PARAMETER_FREE_OPS for op, _ in uncapped)
    capped = derive_cell(probs, DARTS_PRIMITIVES, 4, max_skip_connect=2, max_parameter_free=3)
    # the 3 strongest chosen (edges 0-2) stay; every other edge takes dil_conv_3x3, ties going to earlier inputs
    assert capped == (*uncapped[:3], ("dil_conv_3x3", 1), ("dil_conv_3x3", 0), ("dil_conv_3x3", 1),
                      ("dil_conv_3x3", 0), ("dil_conv_3x3", 1))
    assert derive_cell(probs, DARTS_PRIMITIVES, 4, max_skip_connect=None, max_parameter_free=8) == uncapped


def test_caps_that_no_cell_can_meet_are_refused_in_one_line() -> None:
    probs = torch.softmax(torch.randn(14, 4), dim=-1)
    free_only = ("none", "max_pool_3x3", "avg_pool_3x3", "skip_connect")
    with pytest.raises(UserInputError, match="at most 3 of 8 edges.*add other ops"):
        derive_cell(probs, free_only, 4, max_skip_connect=None, max_parameter_free=3)
    for bad in (-1, 1.5, True):
        with pytest.raises(UserInputError, match="max_parameter_free.*fix search.evolution.max_parameter_free"):
            EvolutionConfig(max_parameter_free=bad)


def test_the_normal_pool_cap_acts_on_the_normal_cell_alone() -> None:
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(14, 8), dim=-1)
    pools = [DARTS_PRIMITIVES.index(op) for op in sorted(POOL_OPS)]
    probs[:, pools] += torch.linspace(1.0, 2.0, 14)[:, None]  # pools lead on every edge, more so on later ones
    kwargs = {"steps": 4, "multiplier": 4, "max_skip_connect": None}
    uncapped = derive_genotype(probs, probs, DARTS_PRIMITIVES, **kwargs)
    assert all(op in POOL_OPS for op, _ in uncapped.normal + uncapped.reduce)
    none_allowed = derive_genotype(probs, probs, DARTS_PRIMITIVES, max_normal_pools=0, **kwargs)
    assert none_allowed.reduce == uncapped.reduce and not any(op in POOL_OPS for op, _ in none_allowed.normal)
    # with no pool left, the cell is DARTS's rule on α without the pools
    masked = probs.clone()
    masked[:, pools] = 0.0
    assert none_allowed.normal == derive_cell(masked, DARTS_PRIMITIVES, 4, max_skip_connect=None)
    three = derive_genotype(probs, probs, DARTS_PRIMITIVES, max_normal_pools=3, **kwargs)
    assert three.reduce == uncapped.reduce

    def pools_by_node(cell):
        return sorted((i // 2, op, j) for i, (op, j) in enumerate(cell) if op in POOL_OPS)

    # the pools kept are the three strongest of the uncapped cell's (the weakest go first)
    starts = [sum(j + 2 for j in range(node)) for node in range(4)]
    weight = {edge: float(probs[starts[edge[0]] + edge[2], DARTS_PRIMITIVES.index(edge[1])])
              for edge in pools_by_node(uncapped.normal)}
    assert pools_by_node(three.normal) == sorted(sorted(weight, key=weight.get)[-3:])
    assert derive_genotype(probs, probs, DARTS_PRIMITIVES, max_normal_pools=8, **kwargs) == uncapped


def test_a_normal_pool_cap_no_cell_can_meet_is_refused_in_one_line() -> None:
    probs = torch.softmax(torch.randn(14, 3), dim=-1)
    with pytest.raises(UserInputError, match="at most 0 of 8 edges.*raise search.evolution.max_normal_pools"):
        derive_genotype(probs, probs, ("none", "max_pool_3x3", "avg_pool_3x3"), steps=4, multiplier=4,
                        max_skip_connect=None, max_normal_pools=0)
    for bad in (-1, 1.5, True):
        with pytest.raises(UserInputError, match="max_normal_pools.*fix search.evolution.max_normal_pools"):
            EvolutionConfig(max_normal_pools=bad)


def test_derived_genotype_builds_a_network() -> None:
    probs = [torch.softmax(torch.randn(14, 8), dim=-1) for _ in range(2)]
    genotype = derive_genotype(*probs, DARTS_PRIMITIVES, steps=4, multiplier=4, max_skip_connect=2)
    assert isinstance(genotype, Genotype) and genotype.normal_concat == (2, 3, 4, 5)
    assert all(op != "none" for op, _ in genotype.normal + genotype.reduce)
    network = build_network(genotype, neuron=NeuronFactory("relu", timesteps=1), channels=4, layers=3, num_classes=10)
    assert network(torch.randn(2, 3, 32, 32))[0].shape == (2, 10)
