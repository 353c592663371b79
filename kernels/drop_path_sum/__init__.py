"""A DARTS node's sum of two edge outputs, each with its own per-sample drop-path scale: public API.

Why: in the retrain every non-identity edge is dropped per sample (scale 0 or 1/keep), and its node sums two
edges. As PyTorch ops that is a broadcast multiply per edge (a strided kernel, not a vectorized one) and an add:
five passes over the activations forward and four backward. Here one kernel reads both terms and writes the
sum; one reads the gradient and writes both terms' gradients.

``drop_path_sum(a, b, scale_a, scale_b, timesteps)`` = ``a · scale_a[b] + b · scale_b[b]`` per sample b of the
``[T*B, ...]`` terms (a scale shared by a sample's T steps; None: the term unscaled). On CUDA ("auto") the
kernels run when both terms share dtype and a dense layout (contiguous or channels_last); elsewhere, and under
torch.compile (which fuses them), PyTorch's ops.
``concat_node_sums(parts)`` is a cell's output, ``torch.cat`` of its nodes along channels, with the nodes that
nothing else reads passed as their terms: the kernels write their sums straight into their channels of the
result, and read their gradients there (no node tensor, no copy of it either way).
"""
from __future__ import annotations

import torch
from torch import Tensor

from kernels.backend import BACKENDS, use_triton

from .reference import drop_path_sum_reference, scaled_per_sample
from .triton import drop_path_sum_bwd, drop_path_sum_fwd

__all__ = ["BACKENDS", "NodeTerms", "concat_node_sums", "drop_path_sum", "drop_path_sum_reference",
           "takes_sliced_gradients"]

# A node's terms for drop_path_sum: (a, b, scale_a, scale_b).
NodeTerms = tuple[Tensor, Tensor, Tensor | None, Tensor | None]


def _dense(x: Tensor) -> bool:
    return x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last))


# The kernels sum in fp32: a float64 sum (e.g. an SNN evaluated in float64) stays on PyTorch's ops.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _problem(a: Tensor, b: Tensor, scales: tuple[Tensor | None, ...], timesteps: int) -> str | None:
    if a.dtype not in DTYPES:
        return f"the Triton drop-path sum takes fp32, fp16 or bf16 terms (it sums in fp32), not {a.dtype}"
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
        ctx.batch, ctx.strides = batch, a.stride()
        return drop_path_sum_fwd(a, b, scale_a, scale_b, batch)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        scale_a, scale_b = ctx.saved_tensors
        grad_a, grad_b = drop_path_sum_bwd(grad, scale_a, scale_b, ctx.batch, ctx.strides)
        return grad_a, grad_b, None, None, None


def takes_sliced_gradients(a: Tensor, b: Tensor, scale_a: Tensor | None, scale_b: Tensor | None, timesteps: int = 1,
                           backend: str = "auto") -> bool:
    """Whether the kernels take these terms (scaled or not), whose backward reads a gradient that is a channel slice
    (e.g. of a cell's concatenation) in place and hands the terms theirs in the terms' layout."""
    if torch.compiler.is_compiling():  # traced, the reference's ops are what Inductor fuses
        return False
    return use_triton(backend, "drop_path_sum", a.device, _problem(a, b, (scale_a, scale_b), timesteps))


def drop_path_sum(a: Tensor, b: Tensor, scale_a: Tensor | None, scale_b: Tensor | None, timesteps: int = 1,
                  backend: str = "auto") -> Tensor:
    """``a · scale_a[sample] + b · scale_b[sample]`` for time-first ``[T*B, ...]`` terms and [B] scales (None:
    unscaled); the scales take no gradient (a drop-path mask). Unscaled terms: PyTorch's add (one pass already)."""
    if (scale_a is not None or scale_b is not None) and takes_sliced_gradients(a, b, scale_a, scale_b, timesteps,
                                                                               backend):
        return _DropPathSum.apply(a, b, scale_a, scale_b, a.shape[0] // timesteps)
    if scale_a is None and scale_b is None:
        return a + b
    return (scaled_per_sample(a, None if scale_a is None else scale_a.to(a.dtype), timesteps)
            + scaled_per_sample(b, None if scale_b is None else scale_b.to(b.dtype), timesteps))


class _ConcatNodeSums(torch.autograd.Function):
    """torch.cat along dim 1 of tensors and of node sums written in place; `kinds` says which flat inputs form a
    part: 1 (a tensor) or 4 (a node's a, b, scale_a, scale_b; absent scales are None)."""

    @staticmethod
    def forward(ctx, kinds: tuple[int, ...], batch: int, layout: torch.memory_format, dense_grads: bool,
                *flat: Tensor | None) -> Tensor:
        parts = _unflatten(kinds, flat)
        first = parts[0] if kinds[0] == 1 else parts[0][0]
        widths = [(part if kind == 1 else part[0]).shape[1] for kind, part in zip(kinds, parts)]
        out = torch.empty((first.shape[0], sum(widths), *first.shape[2:]), dtype=first.dtype, device=first.device,
                          memory_format=layout)
        offset, saved = 0, []
        for kind, part, width in zip(kinds, parts, widths):
            channels = out.narrow(1, offset, width)
            if kind == 1:
                channels.copy_(part)
            else:
                a, b, scale_a, scale_b = part
                scale_a, scale_b = (None if s is None else s.detach().contiguous() for s in (scale_a, scale_b))
                drop_path_sum_fwd(a, b, scale_a, scale_b, batch, out=channels)
                saved += [scale_a, scale_b]
            offset += width
        ctx.save_for_backward(*saved)
        ctx.kinds, ctx.batch, ctx.widths, ctx.layout, ctx.dense_grads = kinds, batch, widths, layout, dense_grads
        ctx.strides = [None if kind == 1 else part[0].stride() for kind, part in zip(kinds, parts)]
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        grad = grad.contiguous(memory_format=ctx.layout)  # a no-op for the gradient of a network in one layout
        scales, offset, grads = iter(ctx.saved_tensors), 0, [None, None, None, None]
        for kind, width, strides in zip(ctx.kinds, ctx.widths, ctx.strides):
            channels = grad.narrow(1, offset, width)
            if kind == 1:
                # a view, as torch.cat's backward hands it; or a dense copy in the layout, which the sum with the
                # tensor's other readers' gradients then keeps (a strided view summed with them comes out NCHW)
                grads.append(channels.contiguous(memory_format=ctx.layout) if ctx.dense_grads else channels)
            else:
                grads += [*drop_path_sum_bwd(channels, next(scales), next(scales), ctx.batch, strides), None, None]
            offset += width
        return tuple(grads)


def _unflatten(kinds: tuple[int, ...], flat: tuple) -> list:
    parts, start = [], 0
    for kind in kinds:
        parts.append(flat[start] if kind == 1 else tuple(flat[start:start + 4]))
        start += kind
    return parts


def concat_node_sums(parts: list[Tensor | NodeTerms], timesteps: int = 1, backend: str = "auto",
                     dense_grads: bool = False) -> Tensor:
    """``torch.cat`` along dim 1 of `parts`, each a tensor or a node's terms (a, b, scale_a, scale_b) standing for
    ``drop_path_sum(a, b, scale_a, scale_b, timesteps)``. Terms that the kernels take (``takes_sliced_gradients``)
    are summed straight into the result when every part shares its dtype, device and layout; otherwise each sum
    is made first and concatenated. ``dense_grads``: where summed in place, each tensor part gets its gradient as a
    dense copy in the common layout instead of a view of the concatenation's."""
    kinds = tuple(1 if isinstance(part, Tensor) else 4 for part in parts)
    tensors = [part if kind == 1 else part[0] for kind, part in zip(kinds, parts)]
    first, layout = tensors[0], _common_layout(tensors)
    in_place = 4 in kinds and layout is not None and all(
        t.dtype == first.dtype and t.device == first.device and t.dim() == first.dim() and t.shape[0] == first.shape[0]
        and t.shape[2:] == first.shape[2:] for t in tensors) and all(
        takes_sliced_gradients(*part, timesteps, backend) for kind, part in zip(kinds, parts) if kind == 4)
    if not in_place:
        return torch.cat([part if kind == 1 else drop_path_sum(*part, timesteps, backend=backend)
                          for kind, part in zip(kinds, parts)], dim=1)
    flat = [item for kind, part in zip(kinds, parts) for item in ((part,) if kind == 1 else part)]
    return _ConcatNodeSums.apply(kinds, first.shape[0] // timesteps, layout, dense_grads, *flat)


def _common_layout(tensors: list[Tensor]) -> torch.memory_format | None:
    """The dense layout that every tensor has (channels_last where any needs it), or None."""
    if all(t.is_contiguous() for t in tensors):
        return torch.contiguous_format
    if all(t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) for t in tensors):
        return torch.channels_last
    return None
