"""`SparseConv2d`: an nn.Conv2d whose forward goes through the spike-sparse dispatcher."""
from __future__ import annotations

import torch
from torch import nn

from kernels.sparse_conv.dispatch import DensityTracker, sparse_conv2d


class SparseConv2d(nn.Conv2d):
    """Drop-in for nn.Conv2d (same constructor, parameters and state_dict keys).

    `backend` picks the implementation ("auto": the dispatcher decides per call, from this
    layer's own sparsity measurements). Only padding_mode="zeros" is supported.
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sparse_conv2d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
            backend=self.backend, tracker=self.density,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, backend={self.backend!r}"
