"""Warm starts: another network's weights copied by name and shape, and LSQ's thresholds read off one batch."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aso_se.train.warm_start import calibrate_thresholds, copy_weights, lsq_threshold
from search_space.errors import UserInputError
from search_space.genotypes import GENOTYPES
from search_space.network import build_network
from search_space.neurons import NeuronFactory
from search_space.neurons.st_bif_qann import QuantizedActivation


def _network(kind: str, *, seed: int, genotype: str = "DARTS_V2", channels: int = 4, **neuron) -> nn.Module:
    torch.manual_seed(seed)
    factory = NeuronFactory(kind, timesteps=1, **neuron)
    return build_network(GENOTYPES[genotype], neuron=factory, channels=channels, layers=3, num_classes=5,
                         in_channels=2, image_size=12)


def _quantizers(network: nn.Module) -> list[QuantizedActivation]:
    return [module for module in network.modules() if isinstance(module, QuantizedActivation)]


def test_a_qann_takes_a_relu_networks_weights_and_keeps_its_own_thresholds() -> None:
    relu = _network("relu", seed=0)
    for parameter in relu.parameters():  # not the initialization a fresh network would draw
        parameter.data.normal_()
    qann = _network("st_bif_qann", seed=1, level=4, sym=False, q_threshold=0.7)
    left = copy_weights(qann, relu.state_dict(), source_name="relu")
    for name, tensor in relu.state_dict().items():
        assert torch.equal(qann.state_dict()[name], tensor), name
    thresholds = [name for name in qann.state_dict() if name.endswith("q_threshold")]
    assert thresholds and sorted(left) == sorted(thresholds)
    assert all(module.q_threshold.item() == pytest.approx(0.7) for module in _quantizers(qann))


def test_weights_of_another_network_shape_are_refused_in_one_line() -> None:
    qann = _network("st_bif_qann", seed=0, level=4, sym=False)
    other = {name: torch.zeros(3, 3, 3) for name in qann.state_dict()}
    with pytest.raises(UserInputError, match="init_from=elsewhere: none of its weights fits this network"):
        copy_weights(qann, other, source_name="elsewhere")


def test_the_lsq_threshold_is_twice_the_mean_magnitude_over_the_root_of_the_largest_count() -> None:
    inputs = torch.tensor([-2.0, 1.0, 0.5, 0.5])
    assert lsq_threshold(inputs, 3) == pytest.approx(2 * 1.0 / math.sqrt(3))
    assert lsq_threshold(inputs, 15) == pytest.approx(2 * 1.0 / math.sqrt(15))


@pytest.mark.parametrize("level", [4, 16])
def test_each_threshold_is_set_from_the_input_it_sees_and_batch_statistics_are_kept(level: int) -> None:
    network = _network("st_bif_qann", seed=2, level=level, sym=False, q_threshold=0.5)
    network.eval()
    images = torch.randn(8, 2, 12, 12) * 3 + 1
    running = {name: buffer.clone() for name, buffer in network.named_buffers()}
    assert calibrate_thresholds(network, images) == len(_quantizers(network))
    assert not network.training
    for name, buffer in network.named_buffers():
        assert torch.equal(buffer, running[name]), name
    # Each θ is LSQ's step of what that quantizer sees with the thresholds before it already set.
    seen: dict[QuantizedActivation, torch.Tensor] = {}
    hooks = [module.register_forward_pre_hook(lambda module, args: seen.setdefault(module, args[0].clone()))
             for module in _quantizers(network)]
    network.train()
    with torch.no_grad():
        network(images)
    for hook in hooks:
        hook.remove()
    thetas = []
    for module in _quantizers(network):
        if seen[module].abs().sum() > 0:
            assert module.q_threshold.item() == pytest.approx(lsq_threshold(seen[module], module.pos_max), rel=1e-5)
            thetas.append(module.q_threshold.item())
    assert len(set(round(theta, 6) for theta in thetas)) > 3 and 0.5 not in thetas
