"""benchmarks/tf32_spiking_training.py: the TF32 emulation is TF32's rounding, reaches the network's convs, and the
benchmark's runs train."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import tf32_spiking_training as bench


def test_rounding_keeps_ten_mantissa_bits_to_nearest():
    ulp = 2.0 ** -10
    values = torch.tensor([1.0, 1 + ulp, 1 + ulp / 4, 1 + ulp / 2, 1 + 3 * ulp / 4, -(1 + ulp / 4), 0.0])
    expected = torch.tensor([1.0, 1 + ulp, 1.0, 1 + ulp, 1 + ulp, -1.0, 0.0])
    assert torch.equal(bench.round_to_tf32(values), expected)
    noise = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 100
    rounded = bench.round_to_tf32(noise)
    assert torch.equal(bench.round_to_tf32(rounded), rounded)  # on the grid already
    assert ((rounded - noise).abs() <= noise.abs() * 2.0 ** -11).all() and not torch.equal(rounded, noise)


def test_convs_inside_the_context_round_their_operands_both_ways():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 7, 7, requires_grad=True)
    grad = torch.randn(2, 4, 7, 7)
    results = {}
    for name, tf32 in (("plain", False), ("tf32", True)):
        x.grad, conv.weight.grad = None, None
        if tf32:
            with bench.emulated_tf32_convs():
                out = conv(x)
        else:
            out = conv(x)
        out.backward(grad)
        results[name] = (out.detach(), x.grad.clone(), conv.weight.grad.clone())
    assert F.conv2d is bench._CONV2D  # restored
    for plain, tf32 in zip(results["plain"], results["tf32"]):
        assert not torch.equal(plain, tf32)  # the rounding is applied, in the forward and in both gradients
        torch.testing.assert_close(tf32, plain, rtol=0, atol=5e-3 * plain.abs().max().item())
    with torch.no_grad():  # on operands already on the TF32 grid, the emulation equals fp32 convs
        conv.weight.copy_(bench.round_to_tf32(conv.weight))
        grid = bench.round_to_tf32(x.detach())
        plain = conv(grid)
        with bench.emulated_tf32_convs():
            torch.testing.assert_close(conv(grid), plain, rtol=1e-6, atol=1e-6)


def test_a_run_trains_two_epochs_through_the_emulated_convs(monkeypatch):
    calls = []
    original = bench._tf32_conv2d
    monkeypatch.setattr(bench, "_tf32_conv2d", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    with bench.emulated_tf32_convs():
        losses = bench.epoch_losses(bench.tiny_network(), seed=0, steps=2)
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert calls  # the network's convs went through the emulation


def test_fewer_than_two_runs_is_refused(capsys):
    assert bench.main(["--runs", "1"]) == 2
    assert "pass 2 or more" in capsys.readouterr().err


@pytest.mark.parametrize("padding", ["same"])
def test_string_padding_is_refused(padding):
    with bench.emulated_tf32_convs(), pytest.raises(ValueError, match="numeric padding"):
        F.conv2d(torch.randn(1, 1, 4, 4), torch.randn(1, 1, 3, 3), padding=padding)


def test_runs_differ_in_their_start_only_when_perturbed(capsys):
    network = bench.tiny_network()
    unperturbed = [bench.epoch_losses(network, seed, steps=2, perturbation=0.0)[0] for seed in (0, 1)]
    perturbed = [bench.epoch_losses(network, seed, steps=2)[0] for seed in (0, 1)]
    assert unperturbed[0] == unperturbed[1]  # epoch 1 has no drop-path: one start, one trajectory
    assert perturbed[0] != perturbed[1]
    assert bench.main(["--perturbation", "-1"]) == 2
    assert "pass 0 or more" in capsys.readouterr().err
