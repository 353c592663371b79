"""DARTS's 3x3 pools (padding 1, stride 1 or 2; the average over the window's pixels inside the image) as one
Triton kernel each way on channels_last tensors: public API.

Why: PyTorch 2.11's channels_last CUDA average-pool backward is wrong with padding (pytorch/pytorch#188344) and
slow (RESULTS.md, "Search step"); these kernels read and write each tensor once.
``pool3x3(x, "avg" | "max", stride)`` equals ``F.avg_pool2d(x, 3, stride, 1, count_include_pad=False)`` /
``F.max_pool2d(x, 3, stride, 1)`` with their gradients; "auto" runs the kernels on CUDA channels_last float
tensors and PyTorch's pools elsewhere; "triton" on CPU tensors needs TRITON_INTERPRET=1.
"""
import torch
from torch import Tensor

from kernels.backend import BACKENDS, use_triton

from .function import Pool3x3Function
from .reference import pool3x3_reference
from .triton import MAX_ELEMENTS

__all__ = ["BACKENDS", "KINDS", "pool3x3", "pool3x3_reference"]

KINDS = ("avg", "max")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _use_triton(x: Tensor, backend: str) -> bool:
    fits = x.dtype in _DTYPES and x.dim() == 4 and x.numel() <= MAX_ELEMENTS
    problem = None if fits else ("the Triton pools take 4-d float16/bfloat16/float32 tensors of at most 2**31 - 1 "
                                 f"elements, got {x.dim()}-d {x.dtype} of {x.numel()}")
    # "auto": channels_last only; NCHW stays on PyTorch's pools, which are right there and need no layout change
    channels_last = x.is_contiguous(memory_format=torch.channels_last)
    return use_triton(backend, "pool3x3", x.device, problem, preferred=channels_last)


def pool3x3(x: Tensor, kind: str, stride: int, backend: str = "auto") -> Tensor:
    """DARTS's 3x3 ``kind`` pool of ``x`` [N, C, H, W] with ``stride`` (1 or 2) and padding 1."""
    if kind not in KINDS or stride not in (1, 2):
        raise ValueError(f"pool3x3: kind {kind!r} and stride {stride} must be one of {KINDS} and 1 or 2")
    if not _use_triton(x, backend) or torch.compiler.is_compiling():
        return pool3x3_reference(x, kind, stride)
    return Pool3x3Function.apply(x, kind, stride)
