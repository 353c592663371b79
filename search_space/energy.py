"""Synaptic operations and energy per image of any network, counted in one forward with hooks.

A conv or linear layer whose input is spikes (its non-zero values share one magnitude: 0/1, or
ST-BIF's ±θ) costs one accumulate (SOP) per non-zero input and output it reaches (its exact fan-out,
borders, stride, dilation and groups included); any other input (the image, a depthwise conv's
output, ReLU or QANN activations) costs its dense multiply-accumulates (MACs). Energy uses the 45 nm
figures of Horowitz (ISSCC 2014): 0.9 pJ per accumulate, 4.6 pJ per MAC. BatchNorm (folded into the
weights at inference), biases, pooling and additions are not counted, as is usual in SNN papers.
``skip_zero_macs=True`` counts a multi-bit input's MACs over its non-zero entries only (each times its
exact fan-out), as hardware that skips zeros would pay: graded spikes, or a ReLU network's activations.
``unit_spikes_as_sops=True`` (which implies skipping zeros) reads graded spikes entry by entry: where every
non-zero value of an input is a whole multiple of its smallest magnitude (one spike), entries of one spike
cost accumulates and entries of several spikes MACs; real-valued inputs (a ReLU's) stay MACs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from search_space.errors import UserInputError

E_AC_PJ, E_MAC_PJ = 0.9, 4.6


@dataclass(frozen=True)
class LayerCount:
    """One call of one conv/linear layer (a layer called twice has two entries)."""

    name: str               # its name in model.named_modules()
    kind: str               # "conv" or "linear"
    spiking_input: bool
    input_elements: int
    input_rate: float       # fraction of non-zero input elements (its firing rate when spiking)
    sops: float             # whole batch, all time steps
    macs: float             # whole batch, all time steps


@dataclass(frozen=True)
class EnergyReport:
    """Counts of one forward; the per-image values are the batch's sums divided by its images."""

    images: int
    sops_per_image: float
    macs_per_image: float
    energy_per_image_uj: float
    layers: list[LayerCount] = field(default_factory=list)

    def as_metrics(self) -> dict[str, float]:
        """The per-image scalars, named as in metrics.json."""
        return {"sops_per_image": self.sops_per_image, "macs_per_image": self.macs_per_image,
                "energy_per_image_uj": self.energy_per_image_uj}


def is_spikes(x: Tensor) -> bool:
    """True when every non-zero value of ``x`` has the same magnitude (an all-zero tensor counts)."""
    magnitudes = x.detach().abs()
    if magnitudes.numel() == 0:
        return True
    largest = magnitudes.amax()  # two reductions, no gather of the non-zero values
    smallest = torch.where(magnitudes != 0, magnitudes, torch.full_like(largest, float("inf"))).amin()
    return bool((largest == 0) | (largest == smallest))


def conv_fan_out_sum(conv: nn.Conv2d, x: Tensor) -> float:
    """Σ over the non-zero inputs of the outputs each reaches. With zero padding an input's reach depends only on
    its pixel (the outputs whose window covers it, in each of its group's output channels), so the sum is the
    non-zero count per pixel (over images and channels) against that reach map; other padding modes re-read real
    inputs at the border and take ``conv_fan_out_by_conv``."""
    if conv.padding_mode != "zeros":
        return conv_fan_out_by_conv(conv, x)
    counts = (x.detach() != 0).sum(dim=tuple(range(x.dim() - 2)), dtype=torch.int64)  # [H, W]: exact
    return float((counts.to(torch.float64) * _reach_map(conv, tuple(x.shape[-2:]), x.device)).sum().item()
                 * (conv.out_channels // conv.groups))


def _reach_map(conv: nn.Conv2d, size: tuple[int, int], device: torch.device) -> Tensor:
    """[H, W]: how many of ``conv``'s output positions read each input pixel (borders, stride, dilation)."""
    # its own small graph, whatever the caller's mode (no_grad, inference_mode, autocast)
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        image = torch.ones(1, 1, *size, dtype=torch.float64, device=device, requires_grad=True)
        window = torch.ones(1, 1, *conv.kernel_size, dtype=torch.float64, device=device)
        outputs = F.conv2d(image, window, None, conv.stride, conv.padding, conv.dilation)
        (reach,) = torch.autograd.grad(outputs.sum(), image)  # ∂Σ outputs/∂pixel: the windows covering it
    return reach[0, 0]


def conv_fan_out_by_conv(conv: nn.Conv2d, x: Tensor) -> float:
    """The same sum as the conv of the non-zero mask with ones, any padding mode (a reflected, replicated or
    circular border re-reads real inputs): exact in float64, one conv of ``x``'s size."""
    groups = conv.groups
    padding = conv.padding
    # float64 keeps every count exact and autocast never lowers it; off anyway, to be explicit.
    with torch.autocast(x.device.type, enabled=False):
        mask = (x.detach() != 0).to(torch.float64)
        if conv.padding_mode != "zeros":
            mask = F.pad(mask, conv._reversed_padding_repeated_twice, mode=conv.padding_mode)
            padding = 0
        ones = mask.new_ones(groups, conv.in_channels // groups, *conv.kernel_size)
        reached = F.conv2d(mask, ones, None, conv.stride, padding, conv.dilation, groups)
    return reached.sum().item() * (conv.out_channels // groups)


def _conv_macs(conv: nn.Conv2d, out: Tensor) -> float:
    return float(out.numel()) * (conv.in_channels // conv.groups) * math.prod(conv.kernel_size)


def _linear_macs(linear: nn.Linear, x: Tensor) -> float:
    return float(x.numel() // linear.in_features) * linear.in_features * linear.out_features


def single_spike_entries(x: Tensor) -> Tensor | None:
    """For graded spikes (every non-zero value a whole multiple of the smallest magnitude), the mask of the
    entries that carry one spike; None for any other input (real values, all zeros)."""
    magnitudes = x.detach().abs().to(torch.float64)
    nonzero = magnitudes[magnitudes != 0]
    if nonzero.numel() == 0:
        return None
    multiples = magnitudes / nonzero.min()  # zeros stay 0: whole multiples too
    if not torch.allclose(multiples, multiples.round(), rtol=0.0, atol=1e-3):
        return None
    return multiples.round() == 1


def _reached(module: nn.Module, x: Tensor) -> float:
    """Σ over the non-zero entries of ``x`` of the outputs each reaches (a linear layer: all of them)."""
    if isinstance(module, nn.Conv2d):
        return conv_fan_out_sum(module, x)
    return float(int((x != 0).sum().item()) * module.out_features)


def _count_layer(name: str, module: nn.Module, x: Tensor, out: Tensor, skip_zero_macs: bool,
                 unit_spikes_as_sops: bool = False) -> LayerCount:
    spikes = is_spikes(x)
    nonzero = int((x != 0).sum().item())
    single = None if spikes or not unit_spikes_as_sops else single_spike_entries(x)
    if single is not None:  # graded spikes: one-spike entries accumulate, the others multiply
        rate = nonzero / x.numel()
        sops = _reached(module, torch.where(single, x, 0.0)) if bool(single.any()) else 0.0
        multi = (x != 0) & ~single
        macs = _reached(module, torch.where(multi, x, 0.0)) if bool(multi.any()) else 0.0
        return LayerCount(name, "conv" if isinstance(module, nn.Conv2d) else "linear", False, x.numel(), rate,
                          sops, macs)
    skip_zero_macs = skip_zero_macs or unit_spikes_as_sops
    if isinstance(module, nn.Conv2d):
        kind, reached = "conv", (conv_fan_out_sum(module, x) if nonzero and (spikes or skip_zero_macs) else 0.0)
        dense = _conv_macs(module, out)
    else:
        kind, reached = "linear", float(nonzero * module.out_features)
        dense = _linear_macs(module, x)
    rate = nonzero / x.numel() if x.numel() else 0.0
    if spikes:
        return LayerCount(name, kind, True, x.numel(), rate, reached, 0.0)
    return LayerCount(name, kind, False, x.numel(), rate, 0.0, reached if skip_zero_macs else dense)


def _images(inputs: Tensor, timesteps: int | None) -> int:
    if not isinstance(inputs, Tensor) or inputs.dim() < 1:
        raise UserInputError("count_energy needs a batched input tensor [B, ...]; pass one batch of images")
    if timesteps is not None and (isinstance(timesteps, bool) or not isinstance(timesteps, int) or timesteps < 1):
        raise UserInputError(f"timesteps={timesteps!r} must be a positive integer or None; fix the call")
    if inputs.dim() == 5:  # time-first frames [T, B, C, H, W]
        if timesteps is not None and inputs.shape[0] != timesteps:
            raise UserInputError(f"the frames hold {inputs.shape[0]} steps but timesteps={timesteps}; pass the same T")
        images = inputs.shape[1]
    elif timesteps is not None:  # flattened time-first [T*B, ...]
        if inputs.shape[0] % timesteps:
            raise UserInputError(f"a flattened [T*B, ...] batch of {inputs.shape[0]} is not a multiple of "
                                 f"timesteps={timesteps}; pass the right T, or None for images [B, ...]")
        images = inputs.shape[0] // timesteps
    else:
        images = inputs.shape[0]
    if images < 1:
        raise UserInputError("count_energy got an empty batch; pass at least one image")
    return images


@torch.no_grad()
def count_energy(model: nn.Module, inputs: Tensor, *, timesteps: int | None = None, e_ac_pj: float = E_AC_PJ,
                 e_mac_pj: float = E_MAC_PJ, skip_zero_macs: bool = False,
                 unit_spikes_as_sops: bool = False) -> EnergyReport:
    """Runs ``model(inputs)`` once, as the model is (put it in eval mode first), counting every conv and linear.

    ``inputs``: images ``[B, ...]`` (a network that encodes them over its T steps itself), time-first
    frames ``[T, B, C, H, W]``, or, with ``timesteps=T``, steps already flattened ``[T*B, ...]``.
    Per image means summed over all time steps and divided by B. Energies in pJ per operation.
    """
    images = _images(inputs, timesteps)
    if e_ac_pj < 0 or e_mac_pj < 0:
        raise UserInputError(f"energies e_ac_pj={e_ac_pj}, e_mac_pj={e_mac_pj} must be >= 0 pJ; fix the call")
    layers: list[LayerCount] = []

    def hook(name: str):
        def record(module: nn.Module, args: tuple[Tensor, ...], out: Tensor) -> None:
            layers.append(_count_layer(name, module, args[0], out, skip_zero_macs, unit_spikes_as_sops))
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
