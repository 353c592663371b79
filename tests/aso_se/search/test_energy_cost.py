"""The spike-aware α loss: per-op energy costs against hand counts, their expectation, and the engine's use."""
from __future__ import annotations

import math

import pytest
import torch

from aso_se.search.arch_params import SamplingConfig
from aso_se.search.energy_cost import expected_energy, measure_op_costs, uniform_energy
from aso_se.search.schedule import SearchSchedule
from search_space.energy import E_MAC_PJ
from search_space.errors import UserInputError
from tests.aso_se.helpers import SMALL_SPACE, Recorder, central_differences, make_engine, random_logits, tiny_supernet
from tests.aso_se.search.test_engine import EVOLUTION, loaders, roundtrip

OPS = {name: i for i, name in enumerate(SMALL_SPACE.primitives)}
NORMAL, REDUCE = 0, 1


def test_relu_costs_are_each_ops_dense_macs():
    supernet = tiny_supernet("relu", timesteps=1)  # cells: normal, reduction, reduction; C = 4
    costs = measure_op_costs(supernet, torch.randn(3, 1, 28, 28))
    pixels, C = 28 * 28, 4  # the normal cell works at the stem's resolution
    depthwise, pointwise = C * pixels * 9, C * C * pixels  # MACs of a 3x3 depthwise and a 1x1 conv
    expected = {"sep_conv_3x3": 2 * (depthwise + pointwise), "dil_conv_3x3": depthwise + pointwise}
    for edge in range(costs.shape[1]):
        for name, macs in expected.items():
            assert costs[NORMAL, edge, OPS[name]].item() == pytest.approx(macs * E_MAC_PJ * 1e-6, rel=1e-6)
        for name in ("none", "max_pool_3x3", "skip_connect"):  # parameter-free at stride 1
            assert costs[NORMAL, edge, OPS[name]] == 0
    # A reduction cell's skip from a cell input is a FactorizedReduce (two strided 1x1 convs): not free.
    # Edge 4 reads node 0, at the cell's own resolution: free again.
    assert costs[REDUCE, 0, OPS["skip_connect"]] > 0 and costs[REDUCE, 4, OPS["skip_connect"]] == 0
    assert supernet.training  # measured in eval mode, the mode restored


def test_spiking_ops_cost_accumulates_and_relu_ops_do_not():
    images = torch.randn(2, 1, 28, 28)
    spiking = measure_op_costs(tiny_supernet("st_bif"), images, e_mac_pj=0.0)
    dense = measure_op_costs(tiny_supernet("relu", timesteps=1), images, e_mac_pj=0.0)
    assert spiking[NORMAL, :, OPS["sep_conv_3x3"]].sum() > 0  # the depthwise convs read spikes: SOPs
    assert dense.sum() == 0


def test_expected_energy_and_its_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, requires_grad=True)
    costs = torch.rand(2, 3, 5)
    energy = expected_energy(logits, costs)
    (grad,) = torch.autograd.grad(energy, logits)
    probs = torch.softmax(logits.detach(), dim=-1)
    assert energy.item() == pytest.approx((probs * costs).sum().item(), rel=1e-6)
    mean_cost = (probs * costs).sum(dim=-1, keepdim=True)
    torch.testing.assert_close(grad, probs * (costs - mean_cost))  # d Σ p·c / dα = p (c - E[c])
    pruned = logits.detach().clone()
    pruned[0, 0, 1:] = -math.inf
    assert uniform_energy(pruned, costs).item() == pytest.approx(
        costs[0, 0, 0].item() + costs[0, 1:].mean(dim=-1).sum().item() + costs[1].mean(dim=-1).sum().item(), rel=1e-6)


def test_the_energy_term_gradient_matches_finite_differences():
    logits = random_logits(1)
    costs = torch.rand(2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    unit = uniform_energy(logits, costs)

    def term(values: torch.Tensor) -> torch.Tensor:
        return expected_energy(values, costs) / unit

    leaf = logits.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(term(leaf), leaf)
    torch.testing.assert_close(grad, central_differences(term, logits.clone()), rtol=1e-6, atol=1e-9)
    assert grad.abs().max() > 1e-3


def search(energy_weight: float, stop_at: int | None = None, state: dict | None = None):
    engine = make_engine(tiny_supernet("st_bif"), schedule=SearchSchedule(cycles=1, warmup_epochs=0, search_epochs=3),
                         sampling=SamplingConfig(k=2), evolution=EVOLUTION, seed=3, energy_weight=energy_weight)
    if state is not None:
        engine.load_state_dict(roundtrip(state))
    recorded = Recorder()
    engine.run(*loaders(), callbacks=recorded,
               should_stop=lambda: stop_at is not None and engine.progress["global_step"] == stop_at)
    return engine, recorded.steps


def relative_energy(engine) -> float:
    costs = measure_op_costs(engine.supernet, torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0)))
    logits = engine._stacked_logits()
    return (expected_energy(logits, costs) / uniform_energy(logits, costs)).item()


def test_energy_weight_steers_alpha_to_cheaper_ops():
    plain, plain_steps = search(0.0)
    frugal, frugal_steps = search(20.0)
    assert relative_energy(frugal) < relative_energy(plain) - 0.05
    assert all("energy_uj" in step for step in frugal_steps) and not any("energy_uj" in s for s in plain_steps)
    assert frugal_steps[-1]["energy_uj"] < frugal_steps[0]["energy_uj"]


@pytest.mark.slow
def test_a_resumed_energy_aware_search_ends_exactly_like_an_uninterrupted_one():
    reference, _ = search(5.0)
    stopped, _ = search(5.0, stop_at=3)  # mid-epoch: the epoch's costs come from the checkpoint
    assert stopped.state_dict()["op_costs"] is not None
    resumed, _ = search(5.0, state=stopped.state_dict())
    torch.testing.assert_close(resumed._stacked_logits(), reference._stacked_logits(), rtol=0, atol=0)


@pytest.mark.parametrize("weight", [-1.0, math.nan, "high"])
def test_a_bad_energy_weight_is_refused(weight):
    with pytest.raises(UserInputError, match="search.energy_weight"):
        make_engine(tiny_supernet("st_bif"), energy_weight=weight)
