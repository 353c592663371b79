"""Synaptic operations and energy per image of any network, counted in one forward with hooks.

A conv or linear layer whose input is spikes (its non-zero values share one magnitude: 0/1, or
ST-BIF's ±θ) costs one accumulate (SOP) per non-zero input and output it reaches (its exact fan-out,
borders, stride, dilation and groups included); any other input (the image, a depthwise conv's
output, ReLU or QANN activations) costs its dense multiply-accumulates (MACs). Energy uses the 45 nm
figures of Horowitz (ISSCC 2014): 0.9 pJ per accumulate, 4.6 pJ per MAC. BatchNorm (folded into the
weights at inference), pooling and additions are not counted, as is usual in SNN papers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

E_AC_PJ, E_MAC_PJ = 0.9, 4.6


@dataclass
class LayerCount:
    name: str
    kind: str               # "conv" or "linear"
    spiking_input: bool
    input_rate: float       # fraction of non-zero input elements
    sops: float
    macs: float


@dataclass
class EnergyReport:
    images: int
    sops_per_image: float
    macs_per_image: float
    energy_per_image_uj: float
    layers: list[LayerCount] = field(default_factory=list)


def is_spikes(x: Tensor) -> bool:
    """True when every non-zero value of ``x`` has the same magnitude (an all-zero tensor counts)."""
    magnitudes = x.detach().abs()
    nonzero = magnitudes[magnitudes != 0]
    return nonzero.numel() == 0 or bool(nonzero.max() == nonzero.min())


def conv_fan_out_sum(conv: nn.Conv2d, x: Tensor) -> float:
    """Σ over the non-zero inputs of the outputs each reaches: the conv of the non-zero mask with ones."""
    groups = conv.groups
    mask = (x.detach() != 0).to(torch.float64)
    ones = mask.new_ones(groups, conv.in_channels // groups, *conv.kernel_size)
    reached = F.conv2d(mask, ones, None, conv.stride, conv.padding, conv.dilation, groups)
    return reached.sum().item() * (conv.out_channels // groups)


def _conv_macs(conv: nn.Conv2d, x: Tensor, out: Tensor) -> float:
    taps = conv.in_channels // conv.groups * conv.kernel_size[0] * conv.kernel_size[1]
    return float(out.numel()) * taps


@torch.no_grad()
def count_energy(model: nn.Module, inputs: Tensor, *, e_ac_pj: float = E_AC_PJ,
                 e_mac_pj: float = E_MAC_PJ) -> EnergyReport:
    """Runs ``model(inputs)`` once (eval mode as the model is) and counts every conv and linear layer.

    ``inputs`` is ``[B, ...]`` images or time-first ``[T, B, ...]`` frames; per image means summed over
    all time steps and divided by B.
    """
    images = inputs.shape[1] if inputs.dim() == 5 else inputs.shape[0]
    layers: list[LayerCount] = []

    def hook(name: str):
        def record(module: nn.Module, args: tuple[Tensor, ...], out: Tensor) -> None:
            x = args[0]
            spikes = is_spikes(x)
            rate = (x != 0).float().mean().item() if x.numel() else 0.0
            if isinstance(module, nn.Conv2d):
                kind = "conv"
                dense = _conv_macs(module, x, out)
                sparse = conv_fan_out_sum(module, x) if spikes else 0.0
            else:
                kind = "linear"
                dense = float(x.numel() // x.shape[-1]) * module.in_features * module.out_features
                sparse = float((x != 0).sum().item()) * module.out_features if spikes else 0.0
            layers.append(LayerCount(name, kind, spikes, rate, sparse, 0.0 if spikes else dense))
        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in model.named_modules()
               if isinstance(module, (nn.Conv2d, nn.Linear))]
    try:
        model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    sops = sum(layer.sops for layer in layers) / images
    macs = sum(layer.macs for layer in layers) / images
    energy_uj = (e_ac_pj * sops + e_mac_pj * macs) * 1e-6
    return EnergyReport(images, sops, macs, energy_uj, layers)
