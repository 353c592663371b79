"""Graded ST-BIF spikes (up to m per step): m = 1 is ST-BIF; every m sums to the QANN's value and converts
exactly; a larger m reaches the QANN's logits in fewer steps."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.st_bif import st_bif_multistep
from search_space.errors import UserInputError
from search_space.graded_st_bif import GradedSTBIF, graded_st_bif
from search_space.qann import QuantizedActivation, convert_to_snn, evaluate_snn
from tests.search_space.test_qann import ALL_OPS, qann_network


@pytest.mark.parametrize("pos_max,neg_min", [(15, 0), (3, -4), (1, -1)])
def test_one_spike_per_step_is_st_bif(pos_max: int, neg_min: int) -> None:
    torch.manual_seed(pos_max)
    x = torch.randn(9, 5, 7, dtype=torch.float64) * 1.5
    theta = torch.tensor(0.3, dtype=torch.float64)
    expected = st_bif_multistep(x, theta, pos_max, neg_min, backend="torch")
    torch.testing.assert_close(graded_st_bif(x, theta, pos_max, neg_min, 1), expected, rtol=0, atol=0)


@pytest.mark.parametrize("level,sym", [(16, False), (8, True), (3, True)])
@pytest.mark.parametrize("m", [2, 3, 7])
def test_any_spikes_per_step_sum_to_the_quantized_total(level: int, sym: bool, m: int) -> None:
    """An input spread over steps, then zeros: silent within the run, the sum θ·clip(floor(X/θ + 0.5)), and no
    step's spike count outside [−m, m]."""
    torch.manual_seed(level + m)
    theta = 0.375
    quantizer = QuantizedActivation(theta, level=level, sym=sym, learn_threshold=False).double()
    drive = torch.cat([torch.randn(4, 2000, dtype=torch.float64) * 2.0, torch.zeros(30, 2000, dtype=torch.float64)])
    out = graded_st_bif(drive, torch.tensor(theta, dtype=torch.float64), quantizer.pos_max, quantizer.neg_min, m)
    counts = out / theta
    widest = min(m, quantizer.pos_max - quantizer.neg_min)  # a step never spans more than the levels
    assert counts.abs().max() == widest and torch.equal(counts, counts.round())  # graded, integer, bounded
    assert out[-5:].abs().sum() == 0
    torch.testing.assert_close(out.sum(0), quantizer(drive.sum(0)), rtol=0, atol=1e-12)


def test_graded_snn_equals_the_qann_in_fewer_steps_in_fp64() -> None:
    network = qann_network(ALL_OPS, seed=4, level=16, sym=False).double()
    batches = [(torch.randn(6, 2, 12, 12, dtype=torch.float64), torch.arange(6) % 5)]
    steps = {}
    for m in (1, 4, 15):
        result = evaluate_snn(network, batches, max_timesteps=256, spikes_per_step=m)
        assert result.silent and result.logit_max_abs_diff <= 1e-9 and result.prediction_agreement == 1.0
        steps[m] = result.snn_timesteps
    assert steps[15] < steps[4] < steps[1]
    # m >= the levels: every neuron emits its whole count at its first step, so T = 1 is the QANN
    assert steps[15] == 1
    assert isinstance(convert_to_snn(network, 2, spikes_per_step=4).cells[0].preprocess0.op[0].neuron, GradedSTBIF)


def test_bad_spikes_per_step_is_refused() -> None:
    network = qann_network(ALL_OPS, seed=1)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(UserInputError, match="spikes_per_step"):
            convert_to_snn(network, 4, spikes_per_step=bad)
    with pytest.raises(ValueError, match="spikes_per_step"):
        GradedSTBIF(torch.tensor(1.0), 3, 0, 0)
    assert isinstance(convert_to_snn(nn.Sequential(QuantizedActivation(0.5, level=4, sym=False)), 2), nn.Module)
