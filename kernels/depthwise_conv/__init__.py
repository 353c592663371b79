"""A depthwise conv (one K x K filter per channel, as in DARTS's sep_conv and dil_conv ops) as one Triton kernel each
way on channels_last tensors: public API.

Why: cuDNN runs a channels_last depthwise backward as two passes over the input and the output gradient (one per
gradient), and its weight gradient reduces over every pixel; here one pass reads each once and writes both gradients
(kernels/depthwise_conv/triton.py). ``depthwise_conv2d(x, weight, stride, padding, dilation)`` equals ``F.conv2d(x,
weight, None, stride, padding, dilation, groups=C)`` with its gradients. "auto" runs PyTorch's conv: measured, these
kernels are slower than cuDNN's on the retrain's shapes, far from their bytes' floor (RESULTS.md, negative results;
``benchmarks/speed.py --case depthwise``, and ``--case retrain_step --rows 1024:fp16:cl:auto:triton`` for the whole
step). "triton" runs them on CUDA float tensors, and on CPU tensors with TRITON_INTERPRET=1. Under autocast both
operands are cast to its dtype, as F.conv2d's are.
"""
import torch
from torch import Tensor

from kernels.backend import BACKENDS, use_triton

from .function import DepthwiseConv2dFunction
from .reference import depthwise_conv2d_reference
from .triton import MAX_ELEMENTS

__all__ = ["BACKENDS", "depthwise_conv2d", "depthwise_conv2d_reference", "is_depthwise"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def is_depthwise(x: Tensor, weight: Tensor, groups: int) -> bool:
    """Whether a conv of x by weight with ``groups`` is depthwise: one square filter per channel."""
    return (x.dim() == 4 and weight.dim() == 4 and groups == x.shape[1] == weight.shape[0]
            and weight.shape[1] == 1 and weight.shape[2] == weight.shape[3])


def _problem(x: Tensor, weight: Tensor) -> str | None:
    if x.dtype not in _DTYPES or weight.dtype not in _DTYPES:
        return f"the Triton depthwise conv takes float16/bfloat16/float32 tensors, got {x.dtype} and {weight.dtype}"
    if x.numel() > MAX_ELEMENTS:
        return f"the Triton depthwise conv takes at most 2**31 - 1 elements, got {x.numel()}"
    return None


def depthwise_conv2d(x: Tensor, weight: Tensor, stride: int, padding: int, dilation: int = 1,
                     backend: str = "auto") -> Tensor:
    """The depthwise conv of x [N, C, H, W] by weight [C, 1, K, K] (no bias): square stride, padding, dilation."""
    if weight.dim() != 4 or weight.shape[1] != 1 or weight.shape[2] != weight.shape[3] or x.dim() != 4 \
            or weight.shape[0] != x.shape[1]:
        raise ValueError(f"depthwise_conv2d: weight {tuple(weight.shape)} must be [C, 1, K, K] for x "
                         f"{tuple(x.shape)} [N, C, H, W]")
    if min(stride, dilation) < 1 or padding < 0:
        raise ValueError(f"depthwise_conv2d: stride {stride} and dilation {dilation} must be >= 1, padding "
                         f"{padding} >= 0")
    # "auto" stays on PyTorch's conv: the kernels were measured slower than cuDNN's
    if not use_triton(backend, "depthwise_conv2d", x.device, _problem(x, weight), preferred=False) \
            or torch.compiler.is_compiling():
        return depthwise_conv2d_reference(x, weight, stride, padding, dilation)
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(dtype), weight.to(dtype)
    elif weight.dtype != x.dtype:
        raise ValueError(f"depthwise_conv2d: x is {x.dtype} but weight is {weight.dtype}; cast one, or use autocast")
    with torch.autocast(x.device.type, enabled=False):
        return DepthwiseConv2dFunction.apply(x, weight, stride, padding, dilation)
