"""A DARTS node's sum of two edge outputs, each with its own per-sample drop-path scale: public API.

Why: in the retrain every non-identity edge is dropped per sample (scale 0 or 1/keep), and its node sums two
edges. As PyTorch ops that is a broadcast multiply per edge (a strided kernel, not a vectorized one) and an add:
five passes over the activations forward and four backward. Here one kernel reads both terms and writes the
sum; one reads the gradient and writes both terms' gradients.

``drop_path_sum(a, b, scale_a, scale_b, timesteps)`` = ``a · scale_a[b] + b · scale_b[b]`` per sample b of the
``[T*B, ...]`` terms (a scale shared by a sample's T steps; None: the term unscaled). On CUDA ("auto") the
kernels run when both terms share dtype and a dense layout (contiguous or channels_last); elsewhere PyTorch's ops.
"""
from __future__ import annotations

import torch
from torch import Tensor

from kernels.backend import BACKENDS, use_triton

from .reference import drop_path_sum_reference, scaled_per_sample
from .triton import drop_path_sum_bwd, drop_path_sum_fwd

__all__ = ["BACKENDS", "drop_path_sum", "drop_path_sum_reference"]


def _dense(x: Tensor) -> bool:
    return x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last))


def _problem(a: Tensor, b: Tensor, scales: tuple[Tensor | None, ...], timesteps: int) -> str | None:
    if not (a.is_floating_point() and a.dim() > 0 and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride() and a.device == b.device and _dense(a)):
        return "the Triton drop-path sum takes two float terms of one shape, dtype and dense layout"
    if a.shape[0] % timesteps or any(s is not None and (s.shape != (a.shape[0] // timesteps,) or s.device != a.device)
                                     for s in scales):
        return "the Triton drop-path sum takes [T*B, ...] terms and scales of shape [B]"
    return None


class _DropPathSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, scale_a: Tensor | None, scale_b: Tensor | None, batch: int) -> Tensor:
        scale_a = None if scale_a is None else scale_a.detach().contiguous()
        scale_b = None if scale_b is None else scale_b.detach().contiguous()
        ctx.save_for_backward(scale_a, scale_b)
        ctx.batch, ctx.shape, ctx.strides = batch, a.shape, a.stride()
        return drop_path_sum_fwd(a, b, scale_a, scale_b, batch)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        scale_a, scale_b = ctx.saved_tensors
        if grad.stride() != ctx.strides:  # the kernel addresses g with the terms' offsets
            grad = torch.empty_strided(ctx.shape, ctx.strides, dtype=grad.dtype, device=grad.device).copy_(grad)
        grad_a, grad_b = drop_path_sum_bwd(grad, scale_a, scale_b, ctx.batch)
        return grad_a, grad_b, None, None, None


def drop_path_sum(a: Tensor, b: Tensor, scale_a: Tensor | None, scale_b: Tensor | None, timesteps: int = 1,
                  backend: str = "auto") -> Tensor:
    """``a · scale_a[sample] + b · scale_b[sample]`` for time-first ``[T*B, ...]`` terms and [B] scales (None:
    unscaled); the scales take no gradient (a drop-path mask)."""
    if scale_a is None and scale_b is None:
        return a + b
    if use_triton(backend, "drop_path_sum", a.device, _problem(a, b, (scale_a, scale_b), timesteps)):
        return _DropPathSum.apply(a, b, scale_a, scale_b, a.shape[0] // timesteps)
    return (scaled_per_sample(a, None if scale_a is None else scale_a.to(a.dtype), timesteps)
            + scaled_per_sample(b, None if scale_b is None else scale_b.to(b.dtype), timesteps))
