"""Spike-sparse 2-D convolution: skips all-zero input blocks, equals F.conv2d for any input.

Public API: `sparse_conv2d` (F.conv2d's arguments plus `backend`), `SparseConv2d` (drop-in
subclass of nn.Conv2d with the same state_dict keys; `SparseConv2d.from_dense`; `set_backend` for
all of a model's), `capture_warmup` (marks the eager warm-up of a CUDA-graph capture to come), and
`PATH_COUNTS`, how many calls took each path, read with `PATH_COUNTS.snapshot_and_reset()` by whoever logs
them (`path_counts` and `reset_path_counts` are its older spelling).
"""
from kernels.sparse_conv.density import DensityTracker
from kernels.sparse_conv.dispatch import (
    PATH_COUNTS,
    PathCounts,
    capture_warmup,
    path_counts,
    reset_path_counts,
    sparse_conv2d,
)
from kernels.sparse_conv.module import FixedRoute, SparseConv2d, set_backend

__all__ = ["PATH_COUNTS", "DensityTracker", "FixedRoute", "PathCounts", "SparseConv2d", "capture_warmup",
           "path_counts", "reset_path_counts", "set_backend", "sparse_conv2d"]
