"""The op registry ``OPS``: every candidate operation of a cell edge, one line per op.

Three families: (a) DARTS's operations (quark0/darts ``cnn/operations.py``) exactly, the ReLU replaced
by the configured neuron (with ``neuron="relu"`` they are DARTS's ops); (b) spiking ops, neuron →
conv → BN; (c) spike-native separable and dilated convs, a neuron before every conv. A conv that follows a neuron reads spikes and is a ``kernels.sparse_conv.SparseConv2d``
(fed the ST-BIF kernel's block map by :func:`neuron_then_conv`); convs after another conv read real
values and stay ``nn.Conv2d``. Attribute names follow DARTS, so state_dict keys match its checkpoints.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from kernels.pool3x3 import pool3x3
from kernels.sparse_conv import SparseConv2d
from search_space.errors import UserInputError
from search_space.neurons import NeuronFactoryFn

OpBuilder = Callable[[int, int, bool, NeuronFactoryFn], nn.Module]

OPS: dict[str, OpBuilder] = {}


def register_op(name: str) -> Callable[[OpBuilder], OpBuilder]:
    """Decorator adding ``builder(C, stride, affine, neuron) -> nn.Module`` to ``OPS`` under ``name``.

    ``C``: channels in and out; ``stride``: 2 on a reduction cell's edges that read its inputs;
    ``affine``: for the BatchNorms (DARTS: False in the supernet, True when retraining); ``neuron``: a
    factory called once per activation, so each is a fresh module. Raises ValueError on a repeated name.
    """

    def add(builder: OpBuilder) -> OpBuilder:
        if name in OPS:
            raise ValueError(f"op {name!r} is already registered")
        OPS[name] = builder
        return builder

    return add


class Zero(nn.Module):
    """DARTS's ``none``: zeros, spatially subsampled by ``stride``."""

    def __init__(self, stride: int) -> None:
        super().__init__()
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            return x.mul(0.0)
        return x[:, :, :: self.stride, :: self.stride].mul(0.0)

    def extra_repr(self) -> str:
        return f"stride={self.stride}"


class UnitAffineBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d(affine=False)`` that hands the kernel a constant unit scale and zero shift.

    The same function, state_dict and running statistics, but PyTorch picks cuDNN's batch norm only
    when a weight and a bias are given; its native NCHW kernels reduce one channel per thread block,
    which leaves most of the GPU idle at the supernet's 16-64 channels (RESULTS.md, search step).
    With a momentum, ``num_batches_tracked`` is not counted: PyTorch reads it only without one, and
    counting costs a kernel launch per norm and training forward.
    """

    def __init__(self, num_features: int, **kwargs) -> None:
        super().__init__(num_features, affine=False, **kwargs)
        del self.weight, self.bias  # the None parameters affine=False registers
        self.register_buffer("weight", torch.ones(num_features), persistent=False)
        self.register_buffer("bias", torch.zeros(num_features), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.momentum is None or not self.track_running_stats:  # the counter is read, or no statistics
            return super().forward(x)
        self._check_input_dim(x)
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                            self.momentum, self.eps)


class DartsAvgPool(nn.AvgPool2d):
    """DARTS's avg_pool_3x3: padding 1, the average over the window's pixels inside the image. channels_last CUDA
    inputs take ``kernels.pool3x3``: PyTorch 2.11's channels_last CUDA backward of this pool is wrong
    (pytorch/pytorch#188344), and ours is faster."""

    def __init__(self, stride: int) -> None:
        super().__init__(3, stride=stride, padding=1, count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pool3x3(x, "avg", self.stride)


class DartsMaxPool(nn.MaxPool2d):
    """DARTS's max_pool_3x3 (padding 1); channels_last CUDA inputs take ``kernels.pool3x3`` (faster)."""

    def __init__(self, stride: int) -> None:
        super().__init__(3, stride=stride, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pool3x3(x, "max", self.stride)


def batch_norm(C: int, affine: bool) -> nn.BatchNorm2d:
    """The ops' BatchNorm: learned scale and shift when ``affine``, else fixed ones (DARTS's supernet)."""
    return nn.BatchNorm2d(C) if affine else UnitAffineBatchNorm2d(C)


def neuron_then_conv(neuron: nn.Module, conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """conv(neuron(x)); where the neuron's kernel can write the block map of its spikes and the
    conv would use it, the conv gets it and skips its prescan (same result)."""
    forward_with_block_map = getattr(neuron, "forward_with_block_map", None)
    if forward_with_block_map is not None and isinstance(conv, SparseConv2d) and conv.wants_block_map(x):
        spikes, block_map = forward_with_block_map(x)
        return conv(spikes, block_map=block_map)
    return conv(neuron(x))


class NeuronConvBN(nn.Module):
    """DARTS's ReLUConvBN with the configured neuron: neuron → conv → BN."""

    def __init__(
        self, C_in: int, C_out: int, kernel_size: int, stride: int, padding: int, *,
        neuron: NeuronFactoryFn, affine: bool = True,
    ) -> None:
        super().__init__()
        self.op = nn.Sequential(
            neuron(),
            SparseConv2d(C_in, C_out, kernel_size, stride=stride, padding=padding, bias=False),
            batch_norm(C_out, affine),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        neuron, conv, bn = self.op
        return bn(neuron_then_conv(neuron, conv, x))


class DilConv(nn.Module):
    """DARTS's dilated separable conv: neuron → depthwise dilated conv → 1x1 conv → BN."""

    def __init__(
        self, C_in: int, C_out: int, kernel_size: int, stride: int, padding: int, dilation: int, *,
        neuron: NeuronFactoryFn, affine: bool = True,
    ) -> None:
        super().__init__()
        self.op = nn.Sequential(
            neuron(),
            SparseConv2d(C_in, C_in, kernel_size, stride=stride, padding=padding, dilation=dilation,
                         groups=C_in, bias=False),
            nn.Conv2d(C_in, C_out, kernel_size=1, padding=0, bias=False),
            batch_norm(C_out, affine),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        neuron, depthwise, pointwise, bn = self.op
        return bn(pointwise(neuron_then_conv(neuron, depthwise, x)))


class SepConv(nn.Module):
    """DARTS's separable conv: the (neuron → depthwise → 1x1 → BN) stack twice, stride on the first."""

    def __init__(
        self, C_in: int, C_out: int, kernel_size: int, stride: int, padding: int, *,
        neuron: NeuronFactoryFn, affine: bool = True,
    ) -> None:
        super().__init__()
        self.op = nn.Sequential(
            neuron(),
            SparseConv2d(C_in, C_in, kernel_size, stride=stride, padding=padding, groups=C_in, bias=False),
            nn.Conv2d(C_in, C_in, kernel_size=1, padding=0, bias=False),
            batch_norm(C_in, affine),
            neuron(),
            SparseConv2d(C_in, C_in, kernel_size, stride=1, padding=padding, groups=C_in, bias=False),
            nn.Conv2d(C_in, C_out, kernel_size=1, padding=0, bias=False),
            batch_norm(C_out, affine),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        neuron_1, depthwise_1, pointwise_1, bn_1, neuron_2, depthwise_2, pointwise_2, bn_2 = self.op
        x = bn_1(pointwise_1(neuron_then_conv(neuron_1, depthwise_1, x)))
        return bn_2(pointwise_2(neuron_then_conv(neuron_2, depthwise_2, x)))


class SpikingDilConv(nn.Module):
    """DilConv whose 1x1 conv reads spikes too: neuron → depthwise dilated conv → BN → neuron → 1x1 conv → BN.

    In DARTS's DilConv the 1x1 conv reads the depthwise conv's real values, dense MACs at every time step;
    here a neuron (a QANN: a quantizer) sits between the two, so every conv of the op reads spikes."""

    def __init__(
        self, C_in: int, C_out: int, kernel_size: int, stride: int, padding: int, dilation: int, *,
        neuron: NeuronFactoryFn, affine: bool = True,
    ) -> None:
        super().__init__()
        self.op = nn.Sequential(
            neuron(),
            SparseConv2d(C_in, C_in, kernel_size, stride=stride, padding=padding, dilation=dilation,
                         groups=C_in, bias=False),
            batch_norm(C_in, affine),
            neuron(),
            SparseConv2d(C_in, C_out, 1, bias=False),
            batch_norm(C_out, affine),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        neuron_1, depthwise, bn_1, neuron_2, pointwise, bn_2 = self.op
        x = bn_1(neuron_then_conv(neuron_1, depthwise, x))
        return bn_2(neuron_then_conv(neuron_2, pointwise, x))


class SpikingSepConv(nn.Module):
    """SepConv whose 1x1 convs read spikes: (neuron → depthwise → BN → neuron → 1x1 → BN) twice, stride on
    the first depthwise conv."""

    def __init__(
        self, C_in: int, C_out: int, kernel_size: int, stride: int, padding: int, *,
        neuron: NeuronFactoryFn, affine: bool = True,
    ) -> None:
        super().__init__()
        self.first = SpikingDilConv(C_in, C_in, kernel_size, stride, padding, 1, neuron=neuron, affine=affine)
        self.second = SpikingDilConv(C_in, C_out, kernel_size, 1, padding, 1, neuron=neuron, affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


class FactorizedReduce(nn.Module):
    """DARTS's stride-2 reduction: neuron, two 1x1 stride-2 convs on pixel grids offset by one, concat, BN.

    Needs even spatial sizes (the two halves must have the same size), as in DARTS.
    """

    def __init__(self, C_in: int, C_out: int, *, neuron: NeuronFactoryFn, affine: bool = True) -> None:
        super().__init__()
        if C_out % 2:
            raise ValueError(f"FactorizedReduce needs an even number of output channels, got {C_out}")
        self.neuron = neuron()
        self.conv_1 = SparseConv2d(C_in, C_out // 2, 1, stride=2, padding=0, bias=False)
        self.conv_2 = SparseConv2d(C_in, C_out // 2, 1, stride=2, padding=0, bias=False)
        self.bn = batch_norm(C_out, affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.neuron(x)
        return self.bn(torch.cat([self.conv_1(x), self.conv_2(x[:, :, 1:, 1:])], dim=1))


# (a) DARTS's operations, exactly as quark0/darts cnn/operations.py defines them.
register_op("none")(lambda C, stride, affine, neuron: Zero(stride))
register_op("avg_pool_3x3")(lambda C, stride, affine, neuron: DartsAvgPool(stride))
register_op("max_pool_3x3")(lambda C, stride, affine, neuron: DartsMaxPool(stride))
register_op("skip_connect")(lambda C, stride, affine, neuron: nn.Identity() if stride == 1 else FactorizedReduce(C, C, neuron=neuron, affine=affine))
register_op("sep_conv_3x3")(lambda C, stride, affine, neuron: SepConv(C, C, 3, stride, 1, neuron=neuron, affine=affine))
register_op("sep_conv_5x5")(lambda C, stride, affine, neuron: SepConv(C, C, 5, stride, 2, neuron=neuron, affine=affine))
register_op("sep_conv_7x7")(lambda C, stride, affine, neuron: SepConv(C, C, 7, stride, 3, neuron=neuron, affine=affine))
register_op("dil_conv_3x3")(lambda C, stride, affine, neuron: DilConv(C, C, 3, stride, 2, 2, neuron=neuron, affine=affine))
register_op("dil_conv_5x5")(lambda C, stride, affine, neuron: DilConv(C, C, 5, stride, 4, 2, neuron=neuron, affine=affine))


@register_op("conv_7x1_1x7")
def _conv_7x1_1x7(C: int, stride: int, affine: bool, neuron: NeuronFactoryFn) -> nn.Module:
    """Used by NASNet/AmoebaNet. A bare nn.Sequential, as in DARTS, for the same state_dict keys."""
    return nn.Sequential(
        neuron(),
        SparseConv2d(C, C, (1, 7), stride=(1, stride), padding=(0, 3), bias=False),
        nn.Conv2d(C, C, (7, 1), stride=(stride, 1), padding=(3, 0), bias=False),
        batch_norm(C, affine),
    )


# (b) Spiking ops: neuron → conv → BN.
register_op("spike_conv_3x3")(lambda C, stride, affine, neuron: NeuronConvBN(C, C, 3, stride, 1, neuron=neuron, affine=affine))
register_op("spike_conv_1x1")(lambda C, stride, affine, neuron: NeuronConvBN(C, C, 1, stride, 0, neuron=neuron, affine=affine))

# (c) Spike-native separable and dilated convs: a neuron before every conv, the 1x1 ones included.
register_op("spike_sep_conv_3x3")(lambda C, stride, affine, neuron: SpikingSepConv(C, C, 3, stride, 1, neuron=neuron, affine=affine))
register_op("spike_sep_conv_5x5")(lambda C, stride, affine, neuron: SpikingSepConv(C, C, 5, stride, 2, neuron=neuron, affine=affine))
register_op("spike_dil_conv_3x3")(lambda C, stride, affine, neuron: SpikingDilConv(C, C, 3, stride, 2, 2, neuron=neuron, affine=affine))
register_op("spike_dil_conv_5x5")(lambda C, stride, affine, neuron: SpikingDilConv(C, C, 5, stride, 4, 2, neuron=neuron, affine=affine))

# The ops without weights on a normal cell's edge (stride 1): the pattern that short retrain proxies reward and
# DARTS papers warn of (a derivation may cap them per cell: search.evolution.max_parameter_free).
PARAMETER_FREE_OPS: frozenset[str] = frozenset({"max_pool_3x3", "avg_pool_3x3", "skip_connect"})
# Of those, the pools: a stride-1 pool blurs a normal cell's features without weights (search.evolution.max_normal_pools).
POOL_OPS: frozenset[str] = frozenset({"max_pool_3x3", "avg_pool_3x3"})

# DARTS's search space, in DARTS's order (quark0/darts cnn/genotypes.py PRIMITIVES).
DARTS_PRIMITIVES: tuple[str, ...] = (
    "none", "max_pool_3x3", "avg_pool_3x3", "skip_connect",
    "sep_conv_3x3", "sep_conv_5x5", "dil_conv_3x3", "dil_conv_5x5",
)
# A spiking search space: the parameter-free DARTS ops plus the plain spiking convs.
SPIKING_PRIMITIVES: tuple[str, ...] = (
    "none", "max_pool_3x3", "avg_pool_3x3", "skip_connect", "spike_conv_3x3", "spike_conv_1x1",
)


# DARTS's space with every weighted op reading spikes: its parameter-free ops, the spike-native
# separable and dilated convs in place of DARTS's, and the plain spiking convs.
SPIKE_NATIVE_PRIMITIVES: tuple[str, ...] = (
    "none", "max_pool_3x3", "avg_pool_3x3", "skip_connect",
    "spike_sep_conv_3x3", "spike_sep_conv_5x5", "spike_dil_conv_3x3", "spike_dil_conv_5x5",
    "spike_conv_3x3", "spike_conv_1x1",
)


# The named primitive lists that conf/search_space/*.yaml refer to.
PRIMITIVE_SETS: dict[str, tuple[str, ...]] = {
    "darts": DARTS_PRIMITIVES, "spiking": SPIKING_PRIMITIVES, "spike_native": SPIKE_NATIVE_PRIMITIVES,
}


def check_primitives(names: Iterable[str] | str) -> tuple[str, ...]:
    """The ops of a named set (``"darts"``) or of a non-empty list of distinct registered ops; else UserInputError."""
    if isinstance(names, str):
        if names in PRIMITIVE_SETS:
            return PRIMITIVE_SETS[names]
        raise UserInputError(f"the primitive list must be a list of op names or one of {sorted(PRIMITIVE_SETS)}, "
                             f"got the string {names!r}; fix search_space.primitives")
    names = tuple(names)
    unknown = [name for name in names if name not in OPS]
    if unknown:
        raise UserInputError(
            f"unknown op(s) {unknown} in the primitive list: known ops are {sorted(OPS)}; fix search_space.primitives"
        )
    if not names or len(set(names)) != len(names):
        raise UserInputError(
            f"the primitive list {list(names)} must be non-empty without repeats; fix search_space.primitives"
        )
    return names
