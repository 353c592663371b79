"""SOP / MAC / energy counts against hand-computed ones on tiny layers, and on a real network."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from search_space.energy import count_energy, is_spikes, single_spike_entries
from search_space.errors import UserInputError
from search_space.genotypes import GENOTYPES
from search_space.network import build_network
from search_space.neurons import NeuronFactory, SpikingNeuron


class Heaviside(nn.Module):
    """0/1 spikes of ``x > 0``: a stateless stand-in for a neuron."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x > 0).float()


def brute_force_sops(conv: nn.Conv2d, x: torch.Tensor) -> int:
    """Every (output, weight tap) pair that reads a non-zero input, enumerated one by one."""
    n, c_in, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = conv.kernel_size, conv.stride, conv.padding, conv.dilation
    out_h, out_w = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    per_group_in, per_group_out = c_in // conv.groups, conv.out_channels // conv.groups
    total = 0
    for sample, out_c, i, j, ki, kj in itertools.product(range(n), range(conv.out_channels), range(out_h),
                                                         range(out_w), range(kh), range(kw)):
        r, c = i * sh - ph + ki * dh, j * sw - pw + kj * dw
        if 0 <= r < h and 0 <= c < w:
            channels = range(out_c // per_group_out * per_group_in, (out_c // per_group_out + 1) * per_group_in)
            total += sum(int(x[sample, ch, r, c] != 0) for ch in channels)
    return total


def test_a_1x1_conv_costs_one_accumulate_per_spike_and_output_channel() -> None:
    x = torch.zeros(1, 2, 4, 4)
    x[0, 0, 1, 2] = x[0, 1, 3, 3] = x[0, 1, 0, 0] = 1.0
    report = count_energy(nn.Conv2d(2, 3, 1, bias=False), x)
    assert report.sops_per_image == 3 * 3 and report.macs_per_image == 0
    layer = report.layers[0]
    assert layer.kind == "conv" and layer.spiking_input and layer.input_rate == pytest.approx(3 / 32)


@pytest.mark.parametrize("position,outputs",
                         [((0, 0), 1), ((1, 1), 4), ((2, 2), 1), ((4, 4), 1), ((3, 1), 4), ((0, 3), 2)])
def test_a_strided_padded_3x3_conv_counts_each_spike_s_exact_fan_out(position, outputs) -> None:
    # 5x5 in, 3x3 out; output i reads rows 2i-1..2i+1, so rows 0, 2, 4 reach 1 output and rows 1, 3 reach 2.
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, position[0], position[1]] = 1.0
    report = count_energy(nn.Conv2d(1, 4, 3, stride=2, padding=1, bias=False), x)
    assert report.sops_per_image == outputs * 4


def test_a_hand_made_spike_map_sums_its_spikes_fan_outs() -> None:
    x = torch.zeros(1, 1, 5, 5)
    for r, c in [(0, 0), (0, 4), (4, 0), (1, 3), (2, 2)]:  # corners reach 1 output, (1, 3) 4, (2, 2) 1
        x[0, 0, r, c] = 1.0
    report = count_energy(nn.Conv2d(1, 2, 3, stride=2, padding=1, bias=False), x)
    assert report.sops_per_image == (1 + 1 + 1 + 4 + 1) * 2


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 1, 1, 1), (2, 1, 1, 2), (2, 0, 2, 1), (1, 2, 2, 4)])
def test_the_fan_out_equals_a_brute_force_enumeration_on_random_spikes(stride, padding, dilation, groups) -> None:
    torch.manual_seed(stride * 10 + groups)
    x = (torch.rand(2, 4, 6, 7) < 0.3).float()
    conv = nn.Conv2d(4, 4, 3, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=False)
    report = count_energy(conv, x)
    assert report.sops_per_image * 2 == brute_force_sops(conv, x) > 0


def test_a_reflect_padded_border_re_reads_the_spike_it_mirrors() -> None:
    # 3x3 input, reflect padding 1: row 1 also sits at padded rows -1 and 3, so it is read 1 + 3 + 1 = 5 times
    # per column tap set (25 reads in all); the corner (0, 0) is mirrored nowhere: 2 x 2 reads.
    x = torch.zeros(1, 1, 3, 3)
    x[0, 0, 1, 1] = 1.0
    reflect = nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect", bias=False)
    assert count_energy(reflect, x).sops_per_image == 25 * 2
    assert count_energy(nn.Conv2d(1, 2, 3, padding=1, bias=False), x).sops_per_image == 9 * 2
    corner = torch.zeros(1, 1, 3, 3)
    corner[0, 0, 0, 0] = 1.0
    assert count_energy(reflect, corner).sops_per_image == 4 * 2


def test_a_depthwise_conv_reaches_only_its_own_channel_and_the_pointwise_after_it_costs_macs() -> None:
    torch.manual_seed(0)
    x = torch.zeros(1, 3, 5, 5)
    x[0, 1, 2, 2] = 1.0   # interior: 9 outputs
    x[0, 2, 0, 4] = 1.0   # corner: 4 outputs
    net = nn.Sequential(nn.Conv2d(3, 3, 3, padding=1, groups=3, bias=False), nn.Conv2d(3, 4, 1, bias=False))
    depthwise, pointwise = count_energy(net, x).layers
    assert depthwise.spiking_input and depthwise.sops == 9 + 4 and depthwise.macs == 0
    assert not pointwise.spiking_input and pointwise.sops == 0 and pointwise.macs == 4 * 5 * 5 * 3


def test_a_linear_layer_and_signed_st_bif_spikes() -> None:
    theta = 0.37
    x = torch.tensor([[theta, 0.0, -theta, 0.0], [0.0, 0.0, theta, 0.0]])
    assert is_spikes(x)
    report = count_energy(nn.Linear(4, 5), x)
    assert report.images == 2 and report.sops_per_image == 3 * 5 / 2 and report.macs_per_image == 0
    assert report.layers[0].kind == "linear"


def test_signed_spikes_cost_what_binary_spikes_at_the_same_places_cost() -> None:
    torch.manual_seed(1)
    binary = (torch.rand(2, 3, 6, 6) < 0.25).float()
    signs = torch.where(torch.rand_like(binary) < 0.5, -1.0, 1.0)
    conv = nn.Conv2d(3, 5, 3, stride=2, padding=1, bias=False)
    expected = brute_force_sops(conv, binary) / 2
    assert count_energy(conv, binary * signs * 0.61).sops_per_image == expected
    two_levels = binary * torch.where(torch.rand_like(binary) < 0.5, 0.61, 1.22)  # two magnitudes: not spikes
    assert not is_spikes(two_levels)
    report = count_energy(conv, two_levels)
    assert report.sops_per_image == 0 and report.macs_per_image == 5 * 3 * 3 * 3 * 9


def test_a_relu_network_costs_only_its_closed_form_macs() -> None:
    x = torch.randn(2, 3, 6, 6)
    assert not is_spikes(x)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2), nn.ReLU(),
                        nn.Flatten(), nn.Linear(8 * 9, 10))
    report = count_energy(net, x)
    assert report.sops_per_image == 0 and all(not layer.spiking_input for layer in report.layers)
    assert report.macs_per_image == 8 * 36 * 3 * 9 + 8 * 9 * 4 * 9 + 8 * 9 * 10


def test_skip_zero_macs_counts_a_multi_bit_input_s_non_zero_entries_times_their_fan_out() -> None:
    """Graded spikes (2θ, −θ, ...) or ReLU outputs: MACs only where the input is non-zero, each its exact
    fan-out (the brute-force enumeration); binary spikes stay SOPs; with no zeros a 1x1 conv pays its dense MACs."""
    torch.manual_seed(3)
    conv = nn.Conv2d(3, 5, 3, stride=2, padding=1, bias=False)
    graded = torch.randint(-2, 3, (2, 3, 7, 7)).float() * 0.5
    assert not is_spikes(graded) and (graded == 0).any()
    sparse = count_energy(conv, graded, skip_zero_macs=True)
    assert sparse.sops_per_image == 0 and sparse.macs_per_image == brute_force_sops(conv, graded) / 2
    assert sparse.macs_per_image < count_energy(conv, graded).macs_per_image
    binary = (graded > 0).float()
    assert count_energy(conv, binary, skip_zero_macs=True).sops_per_image == count_energy(conv, binary).sops_per_image
    pointwise, dense_input = nn.Conv2d(3, 4, 1, bias=False), torch.rand(1, 3, 5, 5) + 0.1
    assert count_energy(pointwise, dense_input, skip_zero_macs=True).macs_per_image == 4 * 3 * 25
    linear = nn.Linear(6, 3)
    x = torch.tensor([[0.0, 1.5, 0.0, -2.0, 0.0, 0.5]])
    assert count_energy(linear, x, skip_zero_macs=True).macs_per_image == 3 * 3


def test_time_steps_of_one_image_are_summed() -> None:
    # Flattened time-first [T*B, ...]: rows 0-1 are step 1 of images 0-1, rows 2-3 step 2.
    x = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    report = count_energy(nn.Linear(3, 2), x, timesteps=2)
    assert report.images == 2 and report.sops_per_image == (2 + 1 + 3 + 0) * 2 / 2
    assert count_energy(nn.Linear(3, 2), x).sops_per_image == (2 + 1 + 3 + 0) * 2 / 4  # read as 4 images


class EncodeTwoSteps(nn.Module):
    """Images [B, C, H, W] → [2*B, C, H, W]: spikes of ``x > 0.5`` at step 1, of ``x > 0`` at step 2."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([(x > 0.5).float(), (x > 0).float()]))


def test_a_network_that_encodes_images_over_time_counts_both_steps_per_image() -> None:
    torch.manual_seed(2)
    x = torch.randn(3, 2, 4, 4)
    report = count_energy(EncodeTwoSteps(), x)
    assert report.images == 3
    assert report.sops_per_image == ((x > 0.5).sum() + (x > 0).sum()).item() * 3 / 3


def test_time_first_frames_count_per_sample() -> None:
    torch.manual_seed(3)
    frames = (torch.rand(2, 3, 2, 4, 4) < 0.4).float()  # [T, B, C, H, W]
    net = nn.Sequential(nn.Flatten(0, 1), nn.Conv2d(2, 5, 1, bias=False))
    report = count_energy(net, frames, timesteps=2)
    assert report.images == 3 and report.sops_per_image == frames.sum().item() * 5 / 3
    with pytest.raises(UserInputError, match="timesteps"):
        count_energy(net, frames, timesteps=4)
    with pytest.raises(UserInputError, match="multiple"):
        count_energy(nn.Linear(3, 2), torch.ones(5, 3), timesteps=2)


def test_energy_adds_0_9_pj_per_accumulate_and_4_6_pj_per_mac() -> None:
    spikes = torch.zeros(1, 2, 3, 3)
    spikes[0, 0, 0, 0] = spikes[0, 1, 2, 1] = 1.0

    class TwoBranches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dense, self.sparse = nn.Linear(4, 3), nn.Conv2d(2, 6, 1, bias=False)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.dense(x), self.sparse(spikes)

    x = torch.randn(2, 4)
    report = count_energy(TwoBranches(), x)  # 2 images: 24 MACs and 2 x 6 SOPs in all
    assert report.macs_per_image == 12 and report.sops_per_image == 6
    assert report.energy_per_image_uj == pytest.approx((0.9 * 6 + 4.6 * 12) * 1e-6)
    custom = count_energy(TwoBranches(), x, e_ac_pj=0.03, e_mac_pj=0.2)
    assert custom.energy_per_image_uj == pytest.approx((0.03 * 6 + 0.2 * 12) * 1e-6)
    assert custom.as_metrics() == {"sops_per_image": 6, "macs_per_image": 12,
                                   "energy_per_image_uj": custom.energy_per_image_uj}
    with pytest.raises(UserInputError, match="e_ac_pj"):
        count_energy(TwoBranches(), x, e_ac_pj=-1.0)


def test_an_all_zero_input_costs_nothing() -> None:
    assert is_spikes(torch.zeros(2, 3))
    report = count_energy(nn.Conv2d(2, 2, 3, padding=1, bias=False), torch.zeros(1, 2, 4, 4))
    assert report.sops_per_image == 0 and report.macs_per_image == 0 and report.layers[0].input_rate == 0


def test_a_spiking_network_counts_the_stem_as_macs_and_its_spikes_as_sops() -> None:
    torch.manual_seed(0)
    net = build_network(GENOTYPES["DARTS_V2"], neuron=NeuronFactory("st_bif", timesteps=2, learn_threshold=False),
                        channels=4, layers=3, num_classes=5, in_channels=3, image_size=8).eval()
    x = torch.randn(3, 3, 8, 8)
    report = count_energy(net, x)
    assert report.images == 3 and report.sops_per_image > 0 and report.macs_per_image > 0
    modules = dict(net.named_modules())
    stem = next(layer for layer in report.layers if modules[layer.name] is net.stem[0])
    assert not stem.spiking_input and stem.macs == 3 * 12 * 8 * 8 * 3 * 9  # once: its output is repeated over T
    assert report.sops_per_image == pytest.approx(sum(layer.sops for layer in report.layers) / 3)
    after_neuron = 0
    for layer in report.layers:
        module = modules[layer.name]
        parent, _, index = layer.name.rpartition(".")
        before = modules[parent][int(index) - 1] if index.isdigit() and int(index) > 0 else None
        if isinstance(before, SpikingNeuron):  # the conv reads that neuron's spikes: same rate
            after_neuron += 1
            assert layer.spiking_input and layer.macs == 0
            assert layer.input_rate == pytest.approx(before.firing_rate.item())
        if isinstance(before, nn.Conv2d) and before.groups > 1:  # pointwise after depthwise: real values
            assert not layer.spiking_input or layer.input_rate == 0
        if layer.spiking_input and isinstance(module, nn.Conv2d):
            nonzero = round(layer.input_rate * layer.input_elements)
            per_spike = module.out_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            assert layer.sops <= nonzero * per_spike and (layer.sops == 0) == (nonzero == 0)
            if module.kernel_size == (1, 1) and module.stride == (1, 1) and module.padding == (0, 0):
                assert layer.sops == nonzero * module.out_channels
    assert after_neuron > 10


def test_a_relu_network_has_no_synaptic_operations() -> None:
    torch.manual_seed(0)
    relu = build_network(GENOTYPES["DARTS_V2"], neuron=NeuronFactory("relu", timesteps=1), channels=4, layers=3,
                         num_classes=5, in_channels=3, image_size=8).eval()
    report = count_energy(relu, torch.randn(2, 3, 8, 8))
    assert report.sops_per_image == 0 and report.macs_per_image > 0
    assert all(not layer.spiking_input or layer.input_rate == 0 for layer in report.layers)


def test_unit_spikes_as_sops_reads_graded_spikes_entry_by_entry() -> None:
    """Entries of one spike (θ) accumulate, entries of several (2θ, -3θ) multiply, zeros cost nothing, each over
    its exact fan-out; binary spikes and real-valued inputs cost what the other conventions give them."""
    torch.manual_seed(4)
    conv = nn.Conv2d(3, 5, 3, stride=2, padding=1, bias=False)
    theta = 0.37
    graded = torch.randint(-3, 4, (2, 3, 7, 7)).float() * theta
    assert (graded.abs() == theta).any() and (graded.abs() > 1.5 * theta).any() and (graded == 0).any()
    report = count_energy(conv, graded, unit_spikes_as_sops=True)
    single = torch.where(graded.abs() == theta, graded, 0.0)
    several = torch.where(graded.abs() > 1.5 * theta, graded, 0.0)
    assert report.sops_per_image == brute_force_sops(conv, single) / 2
    assert report.macs_per_image == brute_force_sops(conv, several) / 2
    skip_zero = count_energy(conv, graded, skip_zero_macs=True)
    assert report.sops_per_image + report.macs_per_image == skip_zero.macs_per_image
    assert report.energy_per_image_uj < skip_zero.energy_per_image_uj
    binary = (graded > 0).float() * theta
    binary_sops = count_energy(conv, binary).sops_per_image
    assert count_energy(conv, binary, unit_spikes_as_sops=True).sops_per_image == binary_sops
    real = torch.rand(2, 3, 7, 7) * (torch.rand(2, 3, 7, 7) < 0.5)  # a ReLU's output: not whole multiples
    assert single_spike_entries(real) is None
    real_report = count_energy(conv, real, unit_spikes_as_sops=True)
    assert real_report.sops_per_image == 0
    assert real_report.macs_per_image == count_energy(conv, real, skip_zero_macs=True).macs_per_image
    linear = nn.Linear(4, 3)
    x = torch.tensor([[0.0, 0.5, -1.0, 1.5]])  # one spike of 0.5, two of several
    linear_report = count_energy(linear, x, unit_spikes_as_sops=True)
    assert linear_report.sops_per_image == 3 and linear_report.macs_per_image == 2 * 3


@pytest.mark.parametrize("kernel,stride,padding,dilation,groups", [
    (1, 1, 0, 1, 1), (3, 1, 1, 1, 1), (3, 2, 1, 1, 1), (3, 1, 2, 2, 1), (5, 1, 2, 1, 6), (3, 2, 1, 1, 6),
    (5, 2, 4, 2, 3), (2, 2, 0, 1, 1), (3, 1, 0, 1, 2), (3, 3, 1, 1, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_the_fan_out_by_pixel_reach_equals_the_conv_of_the_mask_with_ones(kernel, stride, padding, dilation, groups,
                                                                         dtype):
    """Zero padding: the non-zero count per pixel against its reach map is the mask conv's exact sum (odd sizes,
    strides that leave pixels unread, depthwise and grouped convs, half precision, sparse and dense inputs)."""
    from search_space.energy import conv_fan_out_by_conv, conv_fan_out_sum
    generator = torch.Generator().manual_seed(kernel * 100 + stride * 10 + padding)
    conv = nn.Conv2d(6, 12, kernel, stride, padding, dilation, groups)
    for density in (0.05, 0.5, 1.0):
        x = torch.randn(3, 6, 9, 7, generator=generator)
        x = torch.where(torch.rand(x.shape, generator=generator) < density, x, 0.0).to(dtype)
        assert conv_fan_out_sum(conv, x) == conv_fan_out_by_conv(conv, x)
    assert conv_fan_out_sum(conv, torch.zeros(2, 6, 9, 7, dtype=dtype)) == 0.0


def test_a_reflected_border_still_counts_by_the_conv_of_the_mask():
    from search_space.energy import conv_fan_out_by_conv, conv_fan_out_sum
    conv = nn.Conv2d(2, 4, 3, padding=1, padding_mode="reflect")
    x = (torch.rand(2, 2, 5, 5, generator=torch.Generator().manual_seed(1)) < 0.3).float()
    assert conv_fan_out_sum(conv, x) == conv_fan_out_by_conv(conv, x) > 0


def test_the_fan_out_counts_alike_under_no_grad_and_inference_mode():
    from search_space.energy import conv_fan_out_by_conv, conv_fan_out_sum
    conv = nn.Conv2d(3, 5, 3, stride=2, padding=1)
    x = (torch.rand(2, 3, 7, 6, generator=torch.Generator().manual_seed(3)) < 0.4).float()
    want = conv_fan_out_by_conv(conv, x)
    with torch.no_grad():
        assert conv_fan_out_sum(conv, x) == want
    with torch.inference_mode():
        assert conv_fan_out_sum(conv, x) == want
