"""SOP / MAC / energy counts against hand-computed ones on tiny layers and a real network."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from search_space.energy import count_energy, is_spikes
from search_space.genotypes import GENOTYPES
from search_space.network import build_network
from search_space.neurons import NeuronFactory


def test_a_1x1_conv_costs_one_accumulate_per_spike_and_output_channel() -> None:
    x = torch.zeros(1, 2, 4, 4)
    x[0, 0, 1, 2] = x[0, 1, 3, 3] = x[0, 1, 0, 0] = 1.0
    report = count_energy(nn.Conv2d(2, 3, 1, bias=False), x)
    assert report.sops_per_image == 3 * 3 and report.macs_per_image == 0
    assert report.layers[0].spiking_input and report.layers[0].input_rate == pytest.approx(3 / 32)


@pytest.mark.parametrize("position,outputs",
                         [((0, 0), 1), ((1, 1), 4), ((2, 2), 1), ((4, 4), 1), ((3, 1), 4), ((0, 3), 2)])
def test_a_strided_padded_3x3_conv_counts_each_spike_s_exact_fan_out(position, outputs) -> None:
    # Output (i, j) of a 3x3 conv with stride 2 and padding 1 reads input rows 2i-1..2i+1, cols 2j-1..2j+1.
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, position[0], position[1]] = 1.0
    report = count_energy(nn.Conv2d(1, 4, 3, stride=2, padding=1, bias=False), x)
    assert report.sops_per_image == outputs * 4


def test_a_depthwise_conv_reaches_only_its_own_channel() -> None:
    x = torch.zeros(1, 3, 5, 5)
    x[0, 1, 2, 2] = 1.0   # interior: 9 outputs
    x[0, 2, 0, 4] = 1.0   # corner: 4 outputs
    report = count_energy(nn.Conv2d(3, 3, 3, padding=1, groups=3, bias=False), x)
    assert report.sops_per_image == 9 + 4


def test_a_linear_layer_and_signed_st_bif_spikes() -> None:
    theta = 0.37
    x = torch.tensor([[theta, 0.0, -theta, 0.0], [0.0, 0.0, theta, 0.0]])
    assert is_spikes(x)
    report = count_energy(nn.Linear(4, 5), x)
    assert report.images == 2 and report.sops_per_image == 3 * 5 / 2


def test_real_valued_input_costs_dense_macs_and_energy_adds_up() -> None:
    x = torch.randn(2, 3, 6, 6)
    assert not is_spikes(x)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 10))
    report = count_energy(net, x)
    conv_macs = 8 * 6 * 6 * 3 * 9
    assert report.sops_per_image == 0
    assert report.macs_per_image == conv_macs + 8 * 36 * 10
    assert report.energy_per_image_uj == pytest.approx(4.6e-6 * report.macs_per_image)
    custom = count_energy(net, x, e_ac_pj=1.0, e_mac_pj=2.0)
    assert custom.energy_per_image_uj == pytest.approx(2e-6 * report.macs_per_image)


def test_an_all_zero_input_costs_nothing() -> None:
    report = count_energy(nn.Conv2d(2, 2, 3, padding=1, bias=False), torch.zeros(1, 2, 4, 4))
    assert report.sops_per_image == 0 and report.macs_per_image == 0


def test_a_spiking_network_counts_the_stem_as_macs_and_its_spikes_as_sops() -> None:
    torch.manual_seed(0)
    factory = NeuronFactory("st_bif", timesteps=2, learn_threshold=False)
    net = build_network(GENOTYPES["DARTS_V2"], neuron=factory, channels=4, layers=3, num_classes=5,
                        in_channels=3, image_size=8).eval()
    x = torch.randn(3, 3, 8, 8)
    report = count_energy(net, x)
    stem = next(layer for layer in report.layers if layer.name == "stem.0")
    assert not stem.spiking_input and stem.macs == 3 * 12 * 8 * 8 * 3 * 9  # once: its output is repeated over T
    spiking = [layer for layer in report.layers if layer.spiking_input]
    assert spiking and all(layer.macs == 0 for layer in spiking)
    assert report.sops_per_image == pytest.approx(sum(layer.sops for layer in spiking) / 3)
    for layer in spiking:  # at most the dense count, and zero only for silent inputs
        assert layer.sops <= 2 * 3 * 4 * 8 * 8 * 9 * 48 * 48 and (layer.sops == 0) == (layer.input_rate == 0)
    relu = build_network(GENOTYPES["DARTS_V2"], neuron=NeuronFactory("relu", timesteps=1), channels=4, layers=3,
                         num_classes=5, in_channels=3, image_size=8).eval()
    relu_report = count_energy(relu, x)
    assert relu_report.sops_per_image == 0 and relu_report.macs_per_image > 0
