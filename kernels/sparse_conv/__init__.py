"""Spike-sparse 2-D convolution: skips all-zero input blocks, equals F.conv2d for any input.

Public API: `sparse_conv2d` (F.conv2d's arguments plus `backend`), `SparseConv2d` (drop-in
subclass of nn.Conv2d with the same state_dict keys; `SparseConv2d.from_dense`), `capture_warmup`
(marks the eager warm-up of a CUDA-graph capture), and the path counters (`path_counts`,
`reset_path_counts`) for logging.
"""
from kernels.sparse_conv.dispatch import (
    DensityTracker,
    capture_warmup,
    path_counts,
    reset_path_counts,
    sparse_conv2d,
)
from kernels.sparse_conv.module import SparseConv2d

__all__ = ["sparse_conv2d", "SparseConv2d", "DensityTracker", "capture_warmup", "path_counts", "reset_path_counts"]
