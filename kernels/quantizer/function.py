"""The quantizer's autograd: one node either way, on the Triton kernels or the torch reference."""
import torch
from torch import Tensor

from .reference import quantize_backward_reference, quantize_reference
from .triton import quantize_bwd, quantize_fwd


def _dense(x: Tensor) -> bool:
    return x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)


class QuantizeFunction(torch.autograd.Function):
    """Saves x and θ, recomputes x/θ in backward (no intermediate is stored); `triton` picks the kernels."""

    @staticmethod
    def forward(ctx, x: Tensor, theta: Tensor, neg_min: int, pos_max: int, scale: float, triton: bool) -> Tensor:
        if triton and not _dense(x):
            x = x.contiguous()
        ctx.save_for_backward(x, theta)
        ctx.bounds, ctx.scale, ctx.triton = (neg_min, pos_max), scale, triton
        if triton:
            return quantize_fwd(x, theta, neg_min, pos_max)
        return quantize_reference(x, theta, neg_min, pos_max)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None, None]:
        x, theta = ctx.saved_tensors
        neg_min, pos_max = ctx.bounds
        want_theta = ctx.needs_input_grad[1]
        if ctx.triton:
            if grad.stride() != x.stride():  # e.g. a contiguous gradient of a channels_last x, or an expanded one
                grad = torch.empty_like(x).copy_(grad)
            # grad θ in θ's shape and dtype, the scale applied
            grad_x, grad_theta = quantize_bwd(grad, x, theta, neg_min, pos_max, want_theta, ctx.scale)
        else:
            grad_x, grad_theta = quantize_backward_reference(grad, x, theta, neg_min, pos_max, want_theta)
            if grad_theta is not None:
                grad_theta = grad_theta.mul(ctx.scale).to(theta.dtype).reshape(theta.shape)
        return grad_x if ctx.needs_input_grad[0] else None, grad_theta, None, None, None, None
