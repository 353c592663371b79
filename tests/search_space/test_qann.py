"""The QANN and the ST-BIF SNN converted from it compute the same function."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.st_bif import st_bif_multistep
from search_space.errors import UserInputError
from search_space.genotypes import GENOTYPES, Genotype
from search_space.network import build_network
from search_space.neurons import NeuronFactory
from search_space.ops import DARTS_PRIMITIVES
from search_space.qann import QuantizedActivation, convert_to_snn, evaluate_snn

# Every op of the space on some edge of the normal and of the reduction cell.
_OPS = [op for op in DARTS_PRIMITIVES if op != "none"]
ALL_OPS = Genotype(
    normal=tuple((_OPS[i % len(_OPS)], i % 2 if i < 2 else i // 2) for i in range(8)),
    normal_concat=(2, 3, 4, 5),
    reduce=tuple((_OPS[(i + 3) % len(_OPS)], i % 2 if i < 2 else i // 2) for i in range(8)),
    reduce_concat=(2, 3, 4, 5),
)


def qann_network(genotype: Genotype, *, seed: int, level: int = 8, sym: bool = True, layers: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    factory = NeuronFactory("st_bif_qann", timesteps=1, level=level, sym=sym)
    network = build_network(genotype, neuron=factory, channels=4, layers=layers, num_classes=5, in_channels=2,
                            image_size=12)
    for module in network.modules():  # random BN statistics and affine maps, random thresholds
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            if module.affine:
                module.weight.data.uniform_(0.5, 1.5)
                module.bias.data.uniform_(-0.3, 0.3)
        elif isinstance(module, QuantizedActivation):
            module.q_threshold.data.uniform_(0.2, 0.6)
    return network.eval()


@pytest.mark.parametrize("genotype", [ALL_OPS, GENOTYPES["DARTS_V2"]], ids=["all_ops", "darts_v2"])
def test_snn_summed_logits_equal_the_qann_logits_in_fp64(genotype: Genotype) -> None:
    network = qann_network(genotype, seed=1).double()
    x = torch.randn(6, 2, 12, 12, dtype=torch.float64)
    result = evaluate_snn(network, [(x, torch.arange(6) % 5)], max_timesteps=256)
    assert result.silent and result.snn_timesteps > 1  # it takes several steps, and ends
    assert result.logit_max_abs_diff <= 1e-9
    assert result.snn_accuracy == result.qann_accuracy and result.prediction_agreement == 1.0


def test_snn_equals_qann_in_fp32_with_unsigned_levels() -> None:
    network = qann_network(ALL_OPS, seed=2, level=4, sym=False)
    x = torch.randn(4, 2, 12, 12)
    qann_logits = network(x)[0]
    snn = convert_to_snn(network, 64)
    snn_logits = snn(x)[0]
    scale = qann_logits.abs().max()
    assert (snn_logits - qann_logits).abs().max() <= 1e-4 * scale
    assert torch.equal(snn_logits.argmax(1), qann_logits.argmax(1))


def test_the_cap_stops_a_network_that_still_fires(caplog: pytest.LogCaptureFixture) -> None:
    network = qann_network(ALL_OPS, seed=3).double()
    x = torch.randn(2, 2, 12, 12, dtype=torch.float64)
    result = evaluate_snn(network, [(x, torch.zeros(2, dtype=torch.long))], max_timesteps=2)
    assert not result.silent and result.snn_timesteps == 2 and set(result.accuracy_at) == {1, 2}
    assert "still fired" in caplog.text


@pytest.mark.parametrize("level,sym", [(8, True), (4, False), (3, True)])
def test_one_neuron_sums_to_the_quantized_total(level: int, sym: bool) -> None:
    """Any input split over steps, then zeros until silent: θ·clip(floor(X/θ + 0.5))."""
    torch.manual_seed(level)
    theta = 0.37
    quantizer = QuantizedActivation(theta, level=level, sym=sym, learn_threshold=False).double()
    steps = torch.randn(5, 3000, dtype=torch.float64) * 0.6
    steps[:, :6] = torch.tensor([0.5, -0.5, 1.5, -2.5, 3.5, 0.0], dtype=torch.float64) * theta / 5  # exact halves
    total = steps.sum(0)
    drive = torch.cat([steps, torch.zeros(40, 3000, dtype=torch.float64)])
    out = st_bif_multistep(drive, theta, quantizer.pos_max, quantizer.neg_min, backend="torch")
    assert out[-10:].abs().sum() == 0  # silent long before the end
    assert torch.allclose(out.sum(0), quantizer(total), atol=1e-12, rtol=0)


def test_the_quantizer_gradients_are_straight_through_inside_and_lsq_for_theta() -> None:
    quantizer = QuantizedActivation(0.5, level=8, sym=True, learn_threshold=True).double()
    x = torch.tensor([[0.1, 0.74, -2.4, 5.0]], dtype=torch.float64, requires_grad=True)
    quantizer(x).sum().backward()
    assert x.grad.tolist() == [[1.0, 1.0, 0.0, 0.0]]  # -2.4/0.5 and 5/0.5 fall outside [-4.5, 3.5)
    v = x.detach() / 0.5
    expected = (torch.clamp(torch.floor(v + 0.5), -4, 3) - torch.where((v >= -4.5) & (v < 3.5), v, 0 * v)).sum()
    assert quantizer.q_threshold.grad.item() == pytest.approx(expected.item() * (4 * 3) ** -0.5)


def test_a_trained_smoke_network_converts_exactly() -> None:
    network = qann_network(GENOTYPES["DARTS_V2"], seed=4).train()
    optimizer = torch.optim.Adam(network.parameters(), lr=1e-2)
    x, y = torch.randn(16, 2, 12, 12), torch.randint(0, 5, (16,))
    for _ in range(5):
        optimizer.zero_grad()
        nn.functional.cross_entropy(network(x)[0], y).backward()
        optimizer.step()
    result = evaluate_snn(network.double(), [(x.double(), y)], max_timesteps=256)
    assert result.silent and result.logit_max_abs_diff <= 1e-9
    assert result.snn_accuracy == result.qann_accuracy and result.prediction_agreement == 1.0


def test_bad_input_is_refused_with_one_line() -> None:
    with pytest.raises(UserInputError, match="level=1 must be an integer >= 2"):
        NeuronFactory("st_bif_qann", timesteps=1, level=1)
    with pytest.raises(UserInputError, match="set neuron.timesteps=1"):
        NeuronFactory("st_bif_qann", timesteps=4)
    relu_network = build_network(GENOTYPES["DARTS_V2"], neuron=NeuronFactory("relu", timesteps=1), channels=4,
                                 layers=3, num_classes=5, in_channels=2, image_size=12)
    with pytest.raises(UserInputError, match=r"only a network built with neuron=st_bif_qann.*ReLU"):
        convert_to_snn(relu_network, 4)
