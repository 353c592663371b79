"""Spike-sparse 2-D convolution: skips all-zero input blocks, equals F.conv2d for any input.

Public API: `sparse_conv2d` (F.conv2d's arguments plus `backend`), `SparseConv2d` (drop-in
subclass of nn.Conv2d with the same state_dict keys), and the dispatcher's path counters
(`path_counts` snapshot, `reset_path_counts`) for logging.
"""
from kernels.sparse_conv.dispatch import DensityTracker, path_counts, reset_path_counts, sparse_conv2d
from kernels.sparse_conv.module import SparseConv2d

__all__ = ["sparse_conv2d", "SparseConv2d", "DensityTracker", "path_counts", "reset_path_counts"]
