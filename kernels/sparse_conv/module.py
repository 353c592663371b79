"""`SparseConv2d`: an nn.Conv2d whose forward goes through the spike-sparse dispatcher."""
from __future__ import annotations

import torch
from torch import nn

from kernels.block_map import BlockMap
from kernels.sparse_conv import dispatch
from kernels.sparse_conv.dense import dense_conv2d
from kernels.sparse_conv.dispatch import DensityTracker, count_path, fixed_dense_path, sparse_conv2d
from kernels.sparse_conv.triton import interpreted


class SparseConv2d(nn.Conv2d):
    """Drop-in for nn.Conv2d (same constructor, parameters and state_dict keys).

    `backend` picks the implementation ("auto": the dispatcher decides per call, from this
    layer's own sparsity measurements). Only padding_mode="zeros" is supported. `from_dense`
    converts an nn.Conv2d.
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
        self.density = DensityTracker()  # not a buffer: state_dict keys stay nn.Conv2d's
        # (call key, counter, warm-up and captured calls differ) once this layer's eager calls of
        # that key always run on cuDNN: they then skip the dispatcher, whose host work would cost
        # as much as a small layer's GPU time.
        self._dense_route: tuple[tuple, str, bool] | None = None

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
        if self.backend != "auto" or not dispatch._on_gpu(x) or not dispatch.capturing_sparse():
            return False
        return dispatch.captured_call_wants_block_map(x, self.weight, self.stride, self.padding, self.dilation,
                                                      self.groups, self.density)

    def forward(self, x: torch.Tensor, block_map: BlockMap | torch.Tensor | None = None) -> torch.Tensor:
        key = (x.shape, x.stride(), x.dtype, x.device, self.weight.dtype, self.backend,
               torch.is_autocast_enabled(x.device.type))
        route = self._dense_route  # route[2]: warm-up and captured calls go through the dispatcher
        dispatched = route is not None and route[2] and (dispatch.warming_up() or dispatch.capturing_sparse())
        if route is not None and route[0] == key and not dispatched:
            if route[2] and not dispatch._capturing():
                self.density.poll()  # read the density measurement now: no event query in a capture
            count_path(route[1])
            return dense_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        y = sparse_conv2d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
            backend=self.backend, tracker=self.density, block_map=block_map,
        )
        route = fixed_dense_path(x, self.weight, self.stride, self.padding, self.dilation, self.groups, self.backend)
        self._dense_route = None if route is None else (key, *route)
        return y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"
