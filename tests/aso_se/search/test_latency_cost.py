"""The latency-aware α loss: neurons chained per op, hand-counted cells, the smooth depth and the engine's use."""
from __future__ import annotations

import math

import pytest
import torch

from aso_se.search.arch_params import SamplingConfig
from aso_se.search.latency_cost import (
    DEPTH_TEMPERATURE,
    CellChains,
    cell_depth,
    cells_per_type,
    expected_latency,
    neurons_chained,
    steps_per_neuron,
    uniform_latency,
)
from aso_se.search.schedule import SearchSchedule
from search_space.errors import UserInputError
from search_space.genotypes import GENOTYPES, Genotype
from search_space.neurons import NeuronFactory
from search_space.ops import DARTS_PRIMITIVES, SPIKE_NATIVE_PRIMITIVES
from search_space.space import SearchSpace
from tests.aso_se.helpers import SMALL_SPACE, Recorder, central_differences, make_engine, random_logits, tiny_supernet
from tests.aso_se.search.test_engine import EVOLUTION, loaders

DARTS_SPACE, SPIKE_NATIVE_SPACE = SearchSpace(DARTS_PRIMITIVES), SearchSpace(SPIKE_NATIVE_PRIMITIVES)


def genotype_logits(genotype: Genotype, space: SearchSpace) -> torch.Tensor:
    """``[cell types, edges, ops]`` α whose softmax is the genotype: its op alone on each edge it keeps, ``none``
    alone on every other edge."""
    ops = {name: index for index, name in enumerate(space.primitives)}
    first_edge = [sum(2 + earlier for earlier in range(node)) for node in range(space.steps)]
    logits = torch.full((2, first_edge[-1] + space.steps + 1, len(ops)), -math.inf, dtype=torch.float64)
    logits[..., ops["none"]] = 0.0
    for kind, edges in enumerate((genotype.normal, genotype.reduce)):
        for position, (op, state) in enumerate(edges):
            edge = first_edge[position // 2] + state
            assert logits[kind, edge, ops["none"]] == 0, "two ops on one edge: not a one-hot α"
            logits[kind, edge] = -math.inf
            logits[kind, edge, ops[op]] = 0.0
    return logits


def test_each_op_chains_the_neurons_it_applies_in_turn():
    ops = dict.fromkeys((*DARTS_PRIMITIVES, *SPIKE_NATIVE_PRIMITIVES))
    chained = {op: (neurons_chained(op, 1), neurons_chained(op, 2)) for op in ops}
    assert chained == {
        "none": (0, 0), "max_pool_3x3": (0, 0), "avg_pool_3x3": (0, 0),
        "skip_connect": (0, 1),  # at stride 2 a FactorizedReduce, one neuron before its convs
        "sep_conv_3x3": (2, 2), "sep_conv_5x5": (2, 2), "dil_conv_3x3": (1, 1), "dil_conv_5x5": (1, 1),
        "spike_sep_conv_3x3": (4, 4), "spike_sep_conv_5x5": (4, 4),  # a neuron before each of its four convs
        "spike_dil_conv_3x3": (2, 2), "spike_dil_conv_5x5": (2, 2), "spike_conv_3x3": (1, 1), "spike_conv_1x1": (1, 1),
    }


def test_a_neuron_costs_the_steps_its_largest_count_needs():
    assert steps_per_neuron(NeuronFactory("st_bif_qann", timesteps=1, level=4, sym=False)) == 3  # counts 0..3
    assert steps_per_neuron(NeuronFactory("st_bif_qann", timesteps=1)) == 15  # its yaml's 16 unsigned levels
    assert steps_per_neuron(NeuronFactory("st_bif", timesteps=2)) == 4  # 8 symmetric levels: counts -4..3
    assert steps_per_neuron(NeuronFactory("relu", timesteps=1)) == 1  # no levels: a chain counts layers
    assert steps_per_neuron(lambda: torch.nn.ReLU()) == 1


# Hand counts of the longest neuron chain, input to output, per cell type (normal, reduce).
HAND_BUILT = Genotype(  # a reduction cell whose stride-2 skips cost a neuron each
    normal=GENOTYPES["DARTS_V2"].normal, normal_concat=(2, 3, 4, 5),
    reduce=(("skip_connect", 0), ("sep_conv_3x3", 1),  # node 2: max(1, 2) = 2
            ("dil_conv_3x3", 2), ("skip_connect", 1),  # node 3: max(2 + 1, 1) = 3
            ("sep_conv_3x3", 3), ("max_pool_3x3", 0),  # node 4: max(3 + 2, 0) = 5
            ("skip_connect", 4), ("dil_conv_3x3", 1)),  # node 5: max(5 + 0, 1) = 5
    reduce_concat=(2, 3, 4, 5))
HAND_COUNTS = [
    # DARTS_V2's normal cell: nodes 2, 3 and 4 end two neurons deep (a sep_conv from an input), node 5 reads
    # node 2 through a dil_conv: 3. Its reduction cell is pools and stride-1 skips: 0.
    (GENOTYPES["DARTS_V2"], DARTS_SPACE, (3.0, 0.0)),
    # The same wiring in the spike-native space: each sep_conv chains four neurons, the dil_conv two.
    (GENOTYPES["DARTS_V2_SPIKE_NATIVE"], SPIKE_NATIVE_SPACE, (6.0, 0.0)),
    (GENOTYPES["POOR_POOL_SKIP"], DARTS_SPACE, (0.0, 0.0)),
    (HAND_BUILT, DARTS_SPACE, (3.0, 5.0)),
]


@pytest.mark.parametrize("genotype, space, depths", HAND_COUNTS, ids=["darts_v2", "spike_native", "poor", "hand"])
def test_a_one_hot_cell_is_as_deep_as_its_hand_count(genotype, space, depths):
    chains = CellChains.of(space, steps_per_neuron=3)
    logits = genotype_logits(genotype, space)
    exact = cell_depth(logits, chains, temperature=0)
    assert exact.tolist() == list(depths)
    # 6 normal and 2 reduction cells of a 4-level SNN (3 steps per neuron)
    assert expected_latency(logits, chains, (6, 2), temperature=0).item() == 3 * (6 * depths[0] + 2 * depths[1])
    # The smooth depth errs upward only, by at most τ·log 2 per node a chain crosses and τ·log 4 at the output.
    smooth = cell_depth(logits, chains)
    slack = DEPTH_TEMPERATURE * (space.steps * math.log(2) + math.log(space.multiplier))
    assert torch.all(smooth >= exact - 1e-12) and torch.all(smooth <= exact + slack)


def test_the_uniform_mixture_by_hand():
    chains = CellChains.of(SMALL_SPACE)  # none, max_pool, skip, sep_conv, dil_conv; 2 nodes, both concatenated
    logits = torch.zeros(2, 5, 5, dtype=torch.float64)
    # An edge that carries a signal deploys one of 4 ops: normal (0 + 0 + 2 + 1) / 4 = 0.75 neurons; a reduction
    # cell's input edges (0 + 1 + 2 + 1) / 4 = 1. Node 0: 0.75 (1); node 1 reads node 0: 1.5 (1 + 0.75).
    assert cell_depth(logits, chains, temperature=0).tolist() == pytest.approx([1.5, 1.75], rel=1e-12)
    assert uniform_latency(logits, chains, (1, 2), temperature=0).item() == pytest.approx(1.5 + 2 * 1.75, rel=1e-12)
    assert cells_per_type(("normal", "grown", "reduction", "normal", "reduction")) == (3, 2)


def test_cut_off_nodes_and_pruned_ops_keep_the_gradient_finite():
    chains = CellChains.of(SMALL_SPACE)
    logits = torch.randn(2, 5, 5, dtype=torch.float64)
    logits[0, :2, 1:] = -math.inf  # the normal cell's node 0: none alone on both edges
    logits[1, :, 1:] = -math.inf  # the reduction cell: none everywhere, no path at all
    logits.requires_grad_(True)
    depth = cell_depth(logits, chains)
    (grad,) = torch.autograd.grad(depth.sum(), logits)
    assert depth[1] == 0 and depth[0] > 0 and torch.isfinite(grad).all()
    assert torch.all(grad[1] == 0)


def test_the_latency_term_gradient_matches_finite_differences():
    chains = CellChains.of(SMALL_SPACE, steps_per_neuron=3)
    logits = random_logits(0)
    unit = uniform_latency(logits, chains, (2, 2))

    def term(values: torch.Tensor) -> torch.Tensor:
        return expected_latency(values, chains, (2, 2)) / unit

    leaf = logits.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(term(leaf), leaf)
    torch.testing.assert_close(grad, central_differences(term, logits.clone()), rtol=1e-6, atol=1e-9)
    assert grad.abs().max() > 1e-3  # the check compares something


@pytest.mark.parametrize("energy_weight, latency_weight", [(0.7, 0.0), (0.0, 0.7), (0.7, 0.7)],
                         ids=["energy", "latency", "both"])
def test_the_alpha_objective_gradient_matches_finite_differences(energy_weight, latency_weight):
    """The α loss the step descends (cross-entropy on a tiny supernet, entropy, energy and latency terms), float64 on
    the CPU: its autograd gradient against central differences. ReLU neurons and every op with softmax weights (no
    Gumbel noise, no top-k): the loss is then smooth in α, as finite differences need."""
    supernet = tiny_supernet("relu", timesteps=1).double()
    engine = make_engine(supernet, energy_weight=energy_weight, latency_weight=latency_weight)
    step = engine.step
    generator = torch.Generator().manual_seed(0)
    batch = (torch.randn(4, 1, 8, 8, dtype=torch.float64, generator=generator), torch.tensor([0, 3, 5, 9]))
    step.measure_op_costs(batch)
    sample = supernet.draw(1, SamplingConfig(k=None, gumbel=False), temperature=1.0)[0]
    alphas = supernet.arch_parameters()
    with torch.no_grad():
        for alpha in alphas:
            alpha.copy_(torch.randn(alpha.shape, dtype=torch.float64, generator=generator))

    def objective() -> torch.Tensor:
        return step.arch_objective(batch, sample, entropy_weight=0.01)[0]

    loss, parts = step.arch_objective(batch, sample, entropy_weight=0.01)
    assert ("energy_uj" in parts) == (energy_weight > 0) and ("latency_steps" in parts) == (latency_weight > 0)
    grads = torch.autograd.grad(loss, alphas)
    for alpha, grad in zip(alphas, grads):
        with torch.no_grad():
            numeric = central_differences(lambda values: objective(), alpha.data)
        torch.testing.assert_close(grad, numeric, rtol=1e-5, atol=1e-8)
    # The terms moved the gradient: it differs from the accuracy loss's alone.
    plain = make_engine(supernet).step
    plain_grads = torch.autograd.grad(plain.arch_objective(batch, sample, entropy_weight=0.01)[0], alphas)
    assert any((grad - base).abs().max() > 1e-4 for grad, base in zip(grads, plain_grads))


def search(latency_weight: float):
    engine = make_engine(tiny_supernet("st_bif"), schedule=SearchSchedule(cycles=1, warmup_epochs=0, search_epochs=3),
                         sampling=SamplingConfig(k=2), evolution=EVOLUTION, seed=3, latency_weight=latency_weight)
    recorded = Recorder()
    engine.run(*loaders(), callbacks=recorded)
    return engine, recorded


def relative_latency(engine) -> float:
    chains = CellChains.of(engine.supernet.search_space)
    cells = cells_per_type(engine.supernet.structure.cells)
    logits = engine._stacked_logits()
    return (expected_latency(logits, chains, cells) / uniform_latency(logits, chains, cells)).item()


def test_latency_weight_steers_alpha_to_shallower_cells_and_is_logged():
    plain, plain_log = search(0.0)
    quick, quick_log = search(20.0)
    assert relative_latency(quick) < relative_latency(plain) - 0.05
    assert all("latency_steps" in step for step in quick_log.steps) and not any(
        "latency_steps" in step for step in plain_log.steps)
    assert quick_log.steps[-1]["latency_steps"] < quick_log.steps[0]["latency_steps"]
    assert "latency_steps" in quick_log.epochs[-1]


@pytest.mark.parametrize("weight", [-1.0, math.inf, "fast"])
def test_a_bad_latency_weight_is_refused(weight):
    with pytest.raises(UserInputError, match="fix search.latency_weight"):
        make_engine(tiny_supernet("st_bif"), latency_weight=weight)
