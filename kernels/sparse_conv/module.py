"""`SparseConv2d`: an nn.Conv2d whose forward goes through the spike-sparse dispatcher."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from kernels.backend import check_backend
from kernels.block_map import BlockMap
from kernels.depthwise_conv import depthwise_conv2d, is_depthwise
from kernels.sparse_conv import dispatch
from kernels.sparse_conv.dense import dense_conv2d
from kernels.sparse_conv.density import DensityTracker
from kernels.sparse_conv.dispatch import PATH_COUNTS, SPARSE_CONV_BACKENDS, fixed_dense_path, sparse_conv2d
from kernels.sparse_conv.triton import interpreted


class FixedRoute(NamedTuple):
    """A layer's eager calls of one kind that always run on cuDNN: they skip the dispatcher, whose host work
    would cost as much as a small layer's GPU time."""

    key: tuple  # the kind: x's shape, strides, dtype and device, the weight's dtype, the backend, autocast
    path: str  # the counter in PATH_COUNTS that these calls add to
    captures_differ: bool  # warm-up and captured calls of this kind may differ, so they still go through the dispatcher


class SparseConv2d(nn.Conv2d):
    """Drop-in for nn.Conv2d (same constructor, parameters and state_dict keys).

    `backend` picks the implementation ("auto": the dispatcher decides per call, from this
    layer's own sparsity measurements). `depthwise_backend` ("torch", the default; "triton"; "auto") sends a
    depthwise layer's calls to kernels.depthwise_conv instead, whose backward makes both gradients in one pass.
    Only padding_mode="zeros" is supported. `from_dense` converts an nn.Conv2d; `fixed_route` says whether eager
    calls still go through the dispatcher.
    """

    def __init__(self, *args, backend: str = "auto", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.padding_mode != "zeros":
            raise ValueError(
                f"SparseConv2d supports padding_mode='zeros' only, got {self.padding_mode!r}; "
                "use nn.Conv2d for other padding modes"
            )
        if isinstance(self.padding, str):
            raise ValueError(
                f"SparseConv2d needs numeric padding, got padding={self.padding!r}; "
                "pass the padding as an int or a pair"
            )
        self.backend = backend
        self.depthwise_backend = "torch"
        self.density = DensityTracker()  # not a buffer: state_dict keys stay nn.Conv2d's
        self._route: FixedRoute | None = None

    @property
    def fixed_route(self) -> FixedRoute | None:
        """The cuDNN route of this layer's last kind of eager call once the dispatcher has fixed it; None while
        the dispatcher still decides per call (e.g. its next eager call calibrates)."""
        return self._route

    @classmethod
    def from_dense(cls, conv: nn.Conv2d, *, backend: str = "auto") -> SparseConv2d:
        """A SparseConv2d sharing nothing with `conv` but holding copies of its weights."""
        sparse = cls(
            conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
            padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
            bias=conv.bias is not None, padding_mode=conv.padding_mode,
            device=conv.weight.device, dtype=conv.weight.dtype, backend=backend,
        )
        sparse.load_state_dict(conv.state_dict())
        return sparse

    def wants_block_map(self, x: torch.Tensor) -> bool:
        """Whether a block map of input x (written by the ST-BIF kernel before this layer) would be
        used: by the sparse path only ("triton", or an "auto" call captured where it wins)."""
        if self.backend == "triton":
            return x.is_cuda or interpreted()
        if (self.backend != "auto" or not dispatch.on_gpu(x) or torch.compiler.is_compiling()
                or not dispatch.capturing_sparse()):
            return False
        return dispatch.captured_call_wants_block_map(x, self.weight, self.stride, self.padding, self.dilation,
                                                      self.groups, self.density)

    def forward(self, x: torch.Tensor, block_map: BlockMap | torch.Tensor | None = None) -> torch.Tensor:
        if self.depthwise_backend != "torch" and self._square_depthwise(x):
            return depthwise_conv2d(x, self.weight, self.stride[0], self.padding[0], self.dilation[0],
                                    self.depthwise_backend)
        if self.backend == "auto" and torch.compiler.is_compiling():  # as in dispatch: "auto" runs cuDNN compiled
            return dense_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        key = (x.shape, x.stride(), x.dtype, x.device, self.weight.dtype, self.backend,
               torch.is_autocast_enabled(x.device.type))
        route = self._route
        dispatched = route is not None and route.captures_differ and (
            dispatch.warming_up() or dispatch.capturing_sparse())
        if route is not None and route.key == key and not dispatched:
            if route.captures_differ and not dispatch.capturing():
                self.density.poll()  # read the density measurement now: no event query in a capture
            PATH_COUNTS.count(route.path)
            return dense_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        y = sparse_conv2d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
            backend=self.backend, tracker=self.density, block_map=block_map,
        )
        route = fixed_dense_path(x, self.weight, self.stride, self.padding, self.dilation, self.groups, self.backend)
        self._route = None if route is None else FixedRoute(key, *route)
        return y

    def _square_depthwise(self, x: torch.Tensor) -> bool:
        """Whether kernels.depthwise_conv computes this layer: depthwise, no bias, the same geometry on both axes."""
        return (self.bias is None and is_depthwise(x, self.weight, self.groups) and self.stride[0] == self.stride[1]
                and self.padding[0] == self.padding[1] and self.dilation[0] == self.dilation[1])

    def extra_repr(self) -> str:
        depthwise = "" if self.depthwise_backend == "torch" else f", depthwise_backend={self.depthwise_backend!r}"
        return f"{super().extra_repr()}, backend={self.backend!r}{depthwise}"


def set_backend(model: nn.Module, backend: str, depthwise_backend: str | None = None) -> None:
    """Sets `backend` on every SparseConv2d in `model` (e.g. a network built with the default, "auto"), and
    `depthwise_backend` where given."""
    check_backend(backend, "SparseConv2d", SPARSE_CONV_BACKENDS)
    if depthwise_backend is not None:
        check_backend(depthwise_backend, "depthwise_conv2d")
    for module in model.modules():
        if isinstance(module, SparseConv2d):
            module.backend = backend
            if depthwise_backend is not None:
                module.depthwise_backend = depthwise_backend
