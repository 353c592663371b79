"""The dense path of the spike-reading convs: F.conv2d, but a dilated depthwise conv on a channels_last CUDA tensor
runs as an undilated one.

cuDNN (PyTorch 2.11) runs channels_last depthwise convs with dilation 2 on a generic grouped kernel that is several
times slower than its undilated depthwise kernels in every pass (RESULTS.md, "Dilated depthwise convs"); DARTS's
dil_conv ops are such convs. With "same" padding (d·(k−1)/2, odd k) an output pixel of phase (h mod d, w mod d) reads
only input pixels of that phase, d apart: at stride 1 the conv is an undilated conv of each phase image (the d² phases
stacked on the batch dim: one copy in, one out), at stride d an undilated conv of the phase-(0, 0) image alone. The
same products are summed, so the result equals F.conv2d's up to the order of the sums.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.sparse_conv.geometry import _pair


def phase_conv_applies(x: Tensor, weight: Tensor, stride, padding, dilation, groups: int) -> bool:
    """Whether ``conv2d_by_phases`` computes this call: a depthwise conv of a channels_last 4-d tensor with one
    dilation d > 1 on both axes, odd kernels, "same" padding, and stride 1 (sizes divisible by d) or stride d."""
    dh, dw = _pair(dilation)
    if dh < 2 or dh != dw:  # first: most convs are undilated
        return False
    if x.dim() != 4 or weight.dim() != 4 or groups != x.shape[1] or weight.shape[0] != groups or groups < 2:
        return False
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    kh, kw = weight.shape[2], weight.shape[3]
    if kh % 2 == 0 or kw % 2 == 0 or (ph, pw) != (dh * (kh - 1) // 2, dw * (kw - 1) // 2):
        return False
    if not x.is_contiguous(memory_format=torch.channels_last):
        return False
    if (sh, sw) == (1, 1):
        return x.shape[2] % dh == 0 and x.shape[3] % dh == 0
    return (sh, sw) == (dh, dh)


def conv2d_by_phases(x: Tensor, weight: Tensor, bias: Tensor | None, stride, dilation, groups: int) -> Tensor:
    """F.conv2d(x, weight, bias, stride, "same" padding, dilation, groups) for a call ``phase_conv_applies`` to,
    as undilated convs of x's phase images; channels_last in and out."""
    d = _pair(dilation)[0]
    padding = ((weight.shape[2] - 1) // 2, (weight.shape[3] - 1) // 2)
    if _pair(stride) != (1, 1):  # stride d: every tap of every output pixel falls on phase (0, 0)
        phase = x[:, :, ::d, ::d].contiguous(memory_format=torch.channels_last)
        return F.conv2d(phase, weight, bias, 1, padding, 1, groups)
    n, c, h, w = x.shape
    nhwc = x.permute(0, 2, 3, 1)  # a contiguous view of a channels_last x
    phases = nhwc.reshape(n, h // d, d, w // d, d, c).permute(2, 4, 0, 1, 3, 5).reshape(d * d * n, h // d, w // d, c)
    y = F.conv2d(phases.permute(0, 3, 1, 2), weight, bias, 1, padding, 1, groups)
    out = y.permute(0, 2, 3, 1).reshape(d, d, n, h // d, w // d, y.shape[1])
    return out.permute(2, 3, 0, 4, 1, 5).reshape(n, h, w, y.shape[1]).permute(0, 3, 1, 2)


def dense_conv2d(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, dilation, groups: int) -> Tensor:
    """F.conv2d(x, weight, bias, stride, padding, dilation, groups); CUDA calls that ``phase_conv_applies`` to run
    as ``conv2d_by_phases`` (faster there; elsewhere F.conv2d is)."""
    if x.is_cuda and phase_conv_applies(x, weight, stride, padding, dilation, groups):
        return conv2d_by_phases(x, weight, bias, stride, dilation, groups)
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
