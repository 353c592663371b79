"""ST-BIF's quantizer as a trainable activation (the QANN of `neuron=st_bif_qann`): public API.

`quantize(x, θ, neg_min, pos_max, theta_grad_scale)` = θ·clip(floor(x/θ + 0.5), neg_min, pos_max)
(reference.py), differentiable in x (straight-through inside the clip range) and θ (LSQ's gradient times
`theta_grad_scale`). "auto" runs one Triton kernel each way on CUDA and the torch reference elsewhere
and under torch.compile (which fuses it); "triton" on CPU tensors needs TRITON_INTERPRET=1.
"""
import torch
from torch import Tensor

from kernels.backend import BACKENDS, use_triton

from .reference import quantize_backward_reference, quantize_reference, round_half_up
from .triton import quantize_bwd, quantize_fwd

__all__ = ["BACKENDS", "quantize", "quantize_reference", "round_half_up"]

_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _dense(x: Tensor) -> bool:
    return x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)


def _use_triton(x: Tensor, backend: str) -> bool:
    if torch.compiler.is_compiling():
        return False
    fits = x.dtype in _TRITON_DTYPES
    problem = None if fits else f"the Triton quantizer takes float16/bfloat16/float32, got {x.dtype}"
    return use_triton(backend, "quantizer", x.device, problem)


class _Quantize(torch.autograd.Function):
    """One node either way: saves x and θ, recomputes x/θ in backward (no intermediate is stored)."""

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


def quantize(
    x: Tensor, theta: Tensor, neg_min: int, pos_max: int, theta_grad_scale: float = 1.0, *, backend: str = "auto"
) -> Tensor:
    """θ·clip(floor(x/θ + 0.5), neg_min, pos_max), same shape and dtype as x; θ a one-element tensor."""
    return _Quantize.apply(x, theta, neg_min, pos_max, theta_grad_scale, _use_triton(x, backend))
