"""Readable torch reference of ST-BIF's quantizer (the QANN activation): the ground truth.

    y = θ · clip(floor(x/θ + 0.5), neg_min, pos_max)

is what an ST-BIF neuron with threshold θ and spike-count bounds [neg_min, pos_max] emits in total
once silent. The math runs in fp32 for fp16/bf16/fp32 inputs (fp64 stays fp64), as the SNN's states
do; y has x's dtype. Backward: straight-through for x inside the clip range
(v = x/θ in [neg_min − 0.5, pos_max + 0.5)), and LSQ's gradient for θ: round(v) − v inside, the
clipped level outside, summed over all elements (the caller scales it).
"""
import torch
from torch import Tensor


def _math_dtype(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def round_half_up(v: Tensor) -> Tensor:
    """floor(v + 0.5): ST-BIF's rounding (q0 = 0.5), which differs from torch.round at halves."""
    return torch.floor(v + 0.5)


def quantize_reference(x: Tensor, theta: Tensor, neg_min: int, pos_max: int) -> Tensor:
    """The forward: θ·clip(floor(x/θ + 0.5), neg_min, pos_max) in x's dtype."""
    dtype = _math_dtype(x)
    theta = theta.to(dtype)
    return (torch.clamp(round_half_up(x.to(dtype) / theta), neg_min, pos_max) * theta).to(x.dtype)


def quantize_backward_reference(
    grad: Tensor, x: Tensor, theta: Tensor, neg_min: int, pos_max: int, grad_theta: bool
) -> tuple[Tensor, Tensor | None]:
    """(grad_x in x's dtype, the unscaled θ gradient as a 0-dim fp32/fp64 tensor or None)."""
    dtype = _math_dtype(x)
    v = x.to(dtype) / theta.to(dtype)
    inside = (v >= neg_min - 0.5) & (v < pos_max + 0.5)
    grad_x = (grad.to(dtype) * inside).to(x.dtype)
    if not grad_theta:
        return grad_x, None
    q = torch.clamp(round_half_up(v), neg_min, pos_max)
    return grad_x, (grad.to(dtype) * torch.where(inside, q - v, q)).sum()
