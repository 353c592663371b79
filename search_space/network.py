"""The retrain network: DARTS's NetworkCIFAR built from a genotype, with the configured neuron.

With the ``relu`` neuron (T = 1) it is DARTS's network layer for layer, with DARTS's module
order and state_dict keys (so DARTS's checkpoints load). With a spiking neuron every tensor
is ``[T*B, C, H, W]`` inside: the stem encodes the input over T, and the
classifier reads the T-averaged pooled features (= the T-averaged logits, the head being linear).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kernels.sparse_conv import SparseConv2d, set_backend
from search_space.cell import Cell, cell_layouts, reduction_indices
from search_space.errors import UserInputError
from search_space.genotypes import Genotype, load_genotype
from search_space.multistep import Stem, mean_over_time
from search_space.neurons import NeuronFactoryFn

# What model.network.conv_backend may name (kernels/sparse_conv's other backends are for tests).
CONV_BACKENDS = ("auto", "torch")
DEPTHWISE_BACKENDS = ("torch", "triton")

STEM_MULTIPLIER = 3  # DARTS: the stem has 3 * channels channels


def _auxiliary_pool(size: int) -> nn.Module:
    """Pools the auxiliary head's ``size x size`` input to 2x2 (its 2x2 conv then reaches 1x1).

    DARTS's fixed window where it gives 2x2: 5x5 with stride 3 on CIFAR's 8x8 (AuxiliaryHeadCIFAR),
    5x5 with stride 2 on 7x7 (AuxiliaryHeadImageNet's pool, which MNIST's 28x28 input also reaches);
    an adaptive 2x2 average for any other size.
    """
    if 6 <= size <= 8:
        return nn.AvgPool2d(5, stride=size - 5, padding=0, count_include_pad=False)
    return nn.AdaptiveAvgPool2d(2)


class AuxiliaryHead(nn.Module):
    """DARTS's AuxiliaryHeadCIFAR with the configured neuron, averaged over T; trained, never evaluated."""

    def __init__(self, C: int, num_classes: int, *, input_size: int, neuron: NeuronFactoryFn, timesteps: int) -> None:
        super().__init__()
        self.timesteps = timesteps
        self.features = nn.Sequential(
            neuron(),
            _auxiliary_pool(input_size),
            nn.Conv2d(C, 128, 1, bias=False),  # reads pooled spike averages, not spikes
            nn.BatchNorm2d(128),
            neuron(),
            SparseConv2d(128, 768, 2, bias=False),
            nn.BatchNorm2d(768),
            neuron(),
        )
        self.classifier = nn.Linear(768, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(mean_over_time(self.features(x).flatten(1), self.timesteps))


class RetrainNetwork(nn.Module):
    """DARTS's NetworkCIFAR: stem, ``layers`` cells (reductions at 1/3 and 2/3), optional auxiliary head.

    ``forward(x)`` takes images ``[B, C, H, W]`` or time-first frames ``[T, B, C, H, W]`` and returns
    ``(logits, logits_aux)`` as DARTS does: ``logits_aux`` is None unless the auxiliary head exists
    and the network is training. ``drop_path_prob`` is set by the training loop (DARTS ramps it
    linearly over the epochs). The auxiliary head is ``auxiliary_head`` as in DARTS, so
    ``"auxiliary" in name`` selects its parameters (DARTS's parameter count excludes them).
    """

    def __init__(
        self,
        genotype: Genotype,
        *,
        neuron: NeuronFactoryFn,
        timesteps: int,
        channels: int,
        layers: int,
        num_classes: int,
        in_channels: int = 3,
        auxiliary: bool = False,
        image_size: int = 32,
    ) -> None:
        super().__init__()
        self.timesteps = timesteps
        self.drop_path_prob = 0.0
        stem_channels = STEM_MULTIPLIER * channels
        self.stem = Stem(in_channels, stem_channels, timesteps)
        layouts = cell_layouts(
            layers, channels, stem_channels,
            normal_multiplier=len(genotype.normal_concat), reduce_multiplier=len(genotype.reduce_concat),
        )
        self.cells = nn.ModuleList(Cell(genotype, layout, neuron=neuron, timesteps=timesteps) for layout in layouts)
        self.auxiliary_index = reduction_indices(layers)[1]  # DARTS: after the second reduction cell
        if auxiliary:
            # Every reduction before the head halves the size, rounding up (stride-2 ops with padding).
            size = math.ceil(image_size / 2 ** len(set(reduction_indices(layers))))
            C_auxiliary = self.cells[self.auxiliary_index].multiplier * layouts[self.auxiliary_index].C
            self.auxiliary_head = AuxiliaryHead(
                C_auxiliary, num_classes, input_size=size, neuron=neuron, timesteps=timesteps
            )
        else:
            self.auxiliary_head = None
        self.global_pooling = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(self.cells[-1].multiplier * layouts[-1].C, num_classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits_aux = None
        s0 = s1 = self.stem(x)
        for index, cell in enumerate(self.cells):
            s0, s1 = s1, cell(s0, s1, self.drop_path_prob)
            if index == self.auxiliary_index and self.auxiliary_head is not None and self.training:
                logits_aux = self.auxiliary_head(s1)
        features = mean_over_time(self.global_pooling(s1).flatten(1), self.timesteps)
        return self.classifier(features), logits_aux


def parameters_m(network: nn.Module) -> float:
    """Parameters in millions without the auxiliary head (DARTS's count_parameters_in_MB)."""
    return sum(p.numel() for name, p in network.named_parameters() if "auxiliary" not in name) / 1e6


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserInputError(f"{name}={value!r} must be a positive integer; fix model.{name}")
    return value


def build_network(
    genotype: Genotype | str | Path,
    *,
    neuron: NeuronFactoryFn,
    channels: int,
    layers: int,
    num_classes: int,
    in_channels: int = 3,
    auxiliary: bool = False,
    timesteps: int | None = None,
    image_size: int = 32,
    conv_backend: str = "torch",
    depthwise_backend: str = "torch",
) -> RetrainNetwork:
    """The retrain network of ``genotype`` (a Genotype, a bundled name or a genotype JSON path).

    ``neuron`` is a neuron factory, e.g. ``NeuronFactory("st_bif", timesteps=4)`` (what
    ``conf/neuron/<kind>.yaml`` instantiates). ``timesteps`` defaults to the factory's; a value that
    contradicts the factory's is an error. ``image_size`` (the input's height = width) sizes the
    auxiliary head's pooling and must be a multiple of 4 (two reductions through DARTS's FactorizedReduce).
    ``conv_backend`` is every spike-reading conv's backend: "torch" (cuDNN only, the default: the sparse kernels
    did not pay end to end, RESULTS.md) or "auto" (the sparse-conv dispatcher decides per call).
    ``depthwise_backend`` is the depthwise convs' (kernels.depthwise_conv): "torch" (cuDNN, the default) or
    "triton" (one backward pass for both gradients).
    """
    if not isinstance(genotype, Genotype):
        genotype = load_genotype(genotype)
    for name, value in (("channels", channels), ("layers", layers), ("num_classes", num_classes),
                        ("in_channels", in_channels), ("image_size", image_size)):
        _positive_int(name, value)
    if channels % 2:
        raise UserInputError(f"channels={channels} must be even (FactorizedReduce splits them in halves); "
                             "fix model.channels")
    if image_size % 4:
        raise UserInputError(
            f"image_size={image_size} must be a multiple of 4 (two stride-2 reductions of even sizes); resize the input"
        )
    if isinstance(neuron, str) or not callable(neuron):
        raise UserInputError(
            f"neuron={neuron!r} is not a neuron factory: pass one, e.g. neuron=NeuronFactory('st_bif', timesteps=4)"
        )
    factory_steps = getattr(neuron, "timesteps", None)
    if timesteps is None:
        timesteps = factory_steps
    if timesteps is None:
        raise UserInputError("the neuron factory has no `timesteps`: pass timesteps= to build_network")
    if factory_steps is not None and factory_steps != timesteps:
        raise UserInputError(f"timesteps={timesteps} contradicts the neuron factory's {factory_steps}; set only one")
    if conv_backend not in CONV_BACKENDS:
        raise UserInputError(f"conv_backend={conv_backend!r} is not one of {', '.join(CONV_BACKENDS)}; "
                             "fix model.network.conv_backend")
    if depthwise_backend not in DEPTHWISE_BACKENDS:
        raise UserInputError(f"depthwise_backend={depthwise_backend!r} is not one of {', '.join(DEPTHWISE_BACKENDS)}; "
                             "fix model.network.depthwise_backend")
    network = RetrainNetwork(
        genotype, neuron=neuron, timesteps=_positive_int("timesteps", timesteps), channels=channels, layers=layers,
        num_classes=num_classes, in_channels=in_channels, auxiliary=auxiliary, image_size=image_size,
    )
    set_backend(network, conv_backend, depthwise_backend)
    return network
