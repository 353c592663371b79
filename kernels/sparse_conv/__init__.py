"""Spike-sparse 2-D convolution: skips all-zero input blocks, equals F.conv2d for any input.

Public API: `sparse_conv2d` (functional, same arguments as F.conv2d plus `backend`) and
`SparseConv2d` (drop-in subclass of nn.Conv2d with the same state_dict keys).
"""
from kernels.sparse_conv.dispatch import sparse_conv2d
from kernels.sparse_conv.module import SparseConv2d

__all__ = ["sparse_conv2d", "SparseConv2d"]
