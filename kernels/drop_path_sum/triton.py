"""Triton kernels of the drop-path node sum (reference.py), one pass each way, and their launchers.

Both terms share one dense layout whose first dim is outermost (contiguous or channels_last), so one flat
offset addresses each of them and its sample is (offset // elements per row) % B, rows being [T*B].
Forward: read a and b, write a·s_a + b·s_b (fp32 inside). Backward: read the gradient g once, write g·s_a
and g·s_b (only for a scaled term: an unscaled term's gradient is g itself).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.launch import Handle, launch

BLOCK = 2048
NUM_WARPS = 8
_ALIGN = 16  # Triton specializes pointers on their alignment to this many bytes


@triton.jit
def _scaled(x, scale_ptr, sample, mask, SCALED: tl.constexpr):
    """x times its sample's scale (fp32), or x for an unscaled term."""
    if SCALED:
        x = x * tl.load(scale_ptr + sample, mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def _block(n, row_size, batch, BLOCK: tl.constexpr):
    """This program's flat offsets, their mask, and each one's sample: (offset // elements per row) % B."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < n, (offs // row_size) % batch


@triton.jit
def _drop_path_sum_fwd_kernel(a_ptr, b_ptr, scale_a_ptr, scale_b_ptr, out_ptr, n, row_size, batch,
                              SCALED_A: tl.constexpr, SCALED_B: tl.constexpr, BLOCK: tl.constexpr):
    offs, mask, sample = _block(n, row_size, batch, BLOCK)
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    total = _scaled(a, scale_a_ptr, sample, mask, SCALED_A) + _scaled(b, scale_b_ptr, sample, mask, SCALED_B)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _drop_path_sum_bwd_kernel(g_ptr, scale_a_ptr, scale_b_ptr, grad_a_ptr, grad_b_ptr, n, row_size, batch,
                              SCALED_A: tl.constexpr, SCALED_B: tl.constexpr, BLOCK: tl.constexpr):
    offs, mask, sample = _block(n, row_size, batch, BLOCK)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if SCALED_A:
        tl.store(grad_a_ptr + offs, _scaled(g, scale_a_ptr, sample, mask, True).to(grad_a_ptr.dtype.element_ty),
                 mask=mask)
    if SCALED_B:
        tl.store(grad_b_ptr + offs, _scaled(g, scale_b_ptr, sample, mask, True).to(grad_b_ptr.dtype.element_ty),
                 mask=mask)


_FWD_HANDLES: dict[tuple, Handle] = {}
_BWD_HANDLES: dict[tuple, Handle] = {}


def _launch(kernel, handles: dict, tensors: tuple[Tensor, ...], n: int, row_size: int, batch: int,
            scaled: tuple[bool, bool]) -> None:
    device = tensors[0].device
    pointers = tuple(t.data_ptr() for t in tensors)
    key = (tuple(t.dtype for t in tensors), n, row_size, batch, scaled, tuple(p % _ALIGN for p in pointers))
    launch(kernel, handles, key, device.index if device.type == "cuda" else None, -(-n // BLOCK), tensors, pointers,
           (n, row_size, batch, *scaled, BLOCK), NUM_WARPS)


def drop_path_sum_fwd(a: Tensor, b: Tensor, scale_a: Tensor | None, scale_b: Tensor | None, batch: int) -> Tensor:
    """a·s_a + b·s_b with a's strides (a and b: one dense layout, first dim outermost; scales: [batch] or None)."""
    out = torch.empty_like(a)
    n = a.numel()
    if n:
        _launch(_drop_path_sum_fwd_kernel, _FWD_HANDLES, (a, b, _or(scale_a, a), _or(scale_b, a), out), n,
                n // a.shape[0], batch, (scale_a is not None, scale_b is not None))
    return out


def drop_path_sum_bwd(g: Tensor, scale_a: Tensor | None, scale_b: Tensor | None, batch: int
                      ) -> tuple[Tensor, Tensor]:
    """(g·s_a, g·s_b), g itself for an unscaled term; g dense with its first dim outermost."""
    grad_a = g if scale_a is None else torch.empty_like(g)
    grad_b = g if scale_b is None else torch.empty_like(g)
    n = g.numel()
    if n and (scale_a is not None or scale_b is not None):
        _launch(_drop_path_sum_bwd_kernel, _BWD_HANDLES, (g, _or(scale_a, g), _or(scale_b, g), grad_a, grad_b), n,
                n // g.shape[0], batch, (scale_a is not None, scale_b is not None))
    return grad_a, grad_b


def _or(scale: Tensor | None, stand_in: Tensor) -> Tensor:
    """The scale, or a pointer that is never read (its term is unscaled: a constexpr skips the load)."""
    return stand_in if scale is None else scale
