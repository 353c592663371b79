"""The weighted sum's autograd, one node either way: ``TritonWeightedSum`` on the kernels (terms of one dtype and
one dense layout), ``TorchWeightedSum`` on PyTorch's ops (``weights @ stack(terms)`` in the terms' memory order)."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from kernels.memory_order import inverse_order, storage_order

from .triton import weighted_sum_bwd, weighted_sum_fwd


def _out_dtype(first: Tensor) -> torch.dtype:
    """The result's dtype: autocast's where it is on for the terms' device (as for ``weights @ stack(terms)``),
    else the terms'."""
    device = first.device.type
    if torch.is_autocast_enabled(device) and first.is_floating_point():
        return torch.get_autocast_dtype(device)
    return first.dtype


def _flat(t: Tensor, order: tuple[int, ...] | None) -> Tensor:
    """``t``'s elements in the memory order of the first term (a view where ``t`` shares its layout)."""
    return (t if order is None else t.permute(order)).reshape(-1)


class TorchWeightedSum(torch.autograd.Function):
    """``weights @ stack(terms)`` in the terms' memory order, one autograd node (PyTorch's ops inside)."""

    @staticmethod
    def forward(ctx, weights: Tensor, *terms: Tensor) -> Tensor:
        first = terms[0]
        order = None if first.is_contiguous() else storage_order(first)
        shape = first.shape if order is None else first.permute(order).shape
        dtype = _out_dtype(first)
        flat = torch.stack([_flat(t, order) for t in terms]).to(dtype)  # [k, numel]
        w = weights.to(dtype)
        out = torch.mm(w.unsqueeze(0), flat).view(shape)  # inputs in autocast's dtype already: no casts
        ctx.order, ctx.shape, ctx.weights_dtype = order, shape, weights.dtype
        ctx.save_for_backward(w, flat if ctx.needs_input_grad[0] else None)
        return out if order is None else out.permute(inverse_order(order))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        w, flat = ctx.saved_tensors
        grad = _flat(grad, ctx.order).unsqueeze(0).to(w.dtype)
        grad_weights = torch.mm(grad, flat.t()).squeeze(0).to(ctx.weights_dtype) if flat is not None else None
        if not any(ctx.needs_input_grad[1:]):
            return (grad_weights, *(None,) * w.numel())
        inverse = None if ctx.order is None else inverse_order(ctx.order)
        grad_terms = [
            (g.view(ctx.shape) if inverse is None else g.view(ctx.shape).permute(inverse)) if needed else None
            for g, needed in zip(torch.mm(w.unsqueeze(1), grad).unbind(), ctx.needs_input_grad[1:])
        ]
        return (grad_weights, *grad_terms)


def _fits(buffer: Tensor | None, first: Tensor, dtype: torch.dtype) -> bool:
    """Whether a caller's buffer can hold a tensor like ``first`` in ``dtype``: same shape, strides and device."""
    return (buffer is not None and buffer.shape == first.shape and buffer.stride() == first.stride()
            and buffer.dtype == dtype and buffer.device == first.device)


class TritonWeightedSum(torch.autograd.Function):
    """The kernels' autograd node; terms of one dtype and one dense layout (checked by the caller)."""

    @staticmethod
    def forward(ctx, weights: Tensor, grad_buffers: Sequence[Tensor | None] | None, out: Tensor | None,
                *terms: Tensor) -> Tensor:
        first = terms[0]
        dtype = _out_dtype(first)
        if not _fits(out, first, dtype):
            out = torch.empty_like(first, dtype=dtype)  # the terms' strides (they are dense)
        w = weights.detach().contiguous()
        weighted_sum_fwd(list(terms), w, out)
        ctx.weights_dtype, ctx.term_dtype = weights.dtype, first.dtype
        ctx.shape, ctx.strides = first.shape, out.stride()
        ctx.grad_buffers = [b if _fits(b, first, first.dtype) else None for b in grad_buffers or [None] * len(terms)]
        ctx.save_for_backward(w, *(terms if ctx.needs_input_grad[0] else ()))
        return out.detach()  # an alias: a caller's buffer gets no autograd history

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        w, *terms = ctx.saved_tensors
        k = w.numel()
        if grad.stride() != ctx.strides:  # e.g. a slice of a concatenation's gradient: to the terms' layout
            grad = torch.empty_strided(ctx.shape, ctx.strides, dtype=grad.dtype, device=grad.device).copy_(grad)
        needed = ctx.needs_input_grad[3:]
        grads_t: list[Tensor | None] | None = None
        if any(needed):
            missing = sum(1 for b in ctx.grad_buffers if b is None)
            rows = iter(torch.empty((missing, grad.numel()), device=grad.device, dtype=ctx.term_dtype).unbind()
                        if missing else ())
            grads_t = [b if b is not None else next(rows).as_strided(ctx.shape, ctx.strides) for b in ctx.grad_buffers]
        grad_w = weighted_sum_bwd(grad, w, terms or None, k, grads_t)
        grads_t = grads_t or [None] * k
        return (None if grad_w is None else grad_w.to(ctx.weights_dtype), None, None,
                *(g if want else None for g, want in zip(grads_t, needed)))

