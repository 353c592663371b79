"""Triton kernels of the drop-path node sum (reference.py), one pass each way, and their launchers.

Both terms share one dense layout whose first dim is outermost (contiguous or channels_last), so one flat
offset addresses each of them and its sample is (offset // elements per row) % B, rows being [T*B].
Forward: read a and b, write a·s_a + b·s_b (fp32 inside). Backward: read the gradient g once, write g·s_a
and g·s_b (only for a scaled term: an unscaled term's gradient is g itself). The sum (forward) and g (backward)
may also be a slice of a larger tensor along the dim after the rows' runs (a node's channels in its cell's
concatenation): runs of `run` elements `run_stride` apart (`slice_runs`), written or read in place. The row size and
the runs are constants of each compiled kernel (a few per network): their divisions become multiplications, a slice's
runs are stored as vectors, and a block that lies in one row reads its sample's scale once.
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
def _scaled(x, scale_ptr, sample, SCALED: tl.constexpr):
    """x times its sample's scale (fp32), or x for an unscaled term. A sample is < B, also past the tensor's end:
    the load needs no mask."""
    if SCALED:
        x = x * tl.load(scale_ptr + sample).to(tl.float32)
    return x


@triton.jit
def _block(n, ROW_SIZE: tl.constexpr, batch, BLOCK: tl.constexpr):
    """This program's flat offsets, their mask, and each one's sample: (offset // elements per row) % B; one sample
    for the whole block where rows are whole blocks."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if ROW_SIZE % BLOCK == 0:
        sample = (start // ROW_SIZE).to(tl.int32) % batch
    else:  # rows fit int32 (elements do not always): a 32-bit remainder
        sample = (offs // ROW_SIZE).to(tl.int32) % batch
    return offs, offs < n, sample


@triton.jit
def _in_slice(offs, RUN: tl.constexpr, RUN_STRIDE: tl.constexpr, SLICED: tl.constexpr):
    """The offsets of a slice's elements (runs of RUN, RUN_STRIDE apart) for the terms' flat offsets."""
    if SLICED:
        offs = (offs // RUN) * RUN_STRIDE + offs % RUN
    return offs


@triton.jit
def _drop_path_sum_fwd_kernel(a_ptr, b_ptr, scale_a_ptr, scale_b_ptr, out_ptr, n, ROW_SIZE: tl.constexpr, batch,
                              RUN: tl.constexpr, RUN_STRIDE: tl.constexpr, SCALED_A: tl.constexpr,
                              SCALED_B: tl.constexpr, SLICED: tl.constexpr, BLOCK: tl.constexpr):
    offs, mask, sample = _block(n, ROW_SIZE, batch, BLOCK)
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    total = _scaled(a, scale_a_ptr, sample, SCALED_A) + _scaled(b, scale_b_ptr, sample, SCALED_B)
    tl.store(out_ptr + _in_slice(offs, RUN, RUN_STRIDE, SLICED), total.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _drop_path_sum_bwd_kernel(g_ptr, scale_a_ptr, scale_b_ptr, grad_a_ptr, grad_b_ptr, n, ROW_SIZE: tl.constexpr,
                              batch, RUN: tl.constexpr, RUN_STRIDE: tl.constexpr, SCALED_A: tl.constexpr,
                              SCALED_B: tl.constexpr, SLICED: tl.constexpr, BLOCK: tl.constexpr):
    offs, mask, sample = _block(n, ROW_SIZE, batch, BLOCK)
    g = tl.load(g_ptr + _in_slice(offs, RUN, RUN_STRIDE, SLICED), mask=mask, other=0.0).to(tl.float32)
    if SCALED_A:
        tl.store(grad_a_ptr + offs, _scaled(g, scale_a_ptr, sample, True).to(grad_a_ptr.dtype.element_ty),
                 mask=mask)
    if SCALED_B:
        tl.store(grad_b_ptr + offs, _scaled(g, scale_b_ptr, sample, True).to(grad_b_ptr.dtype.element_ty),
                 mask=mask)


_FWD_HANDLES: dict[tuple, Handle] = {}
_BWD_HANDLES: dict[tuple, Handle] = {}


def _launch(kernel, handles: dict, tensors: tuple[Tensor, ...], batch: int, scales: tuple[Tensor | None, ...],
            runs: tuple[int, int] | None) -> None:
    """Both kernels' launch: tensors[0] has the terms' shape; `runs`: the sliced tensor's (run, run stride)."""
    n = tensors[0].numel()
    run, run_stride = runs or (1, 1)  # constants of the compiled kernel: unused ones fixed, not the size
    row_size = n // tensors[0].shape[0]
    # a block within one row reads its sample's scale once: the largest block that divides the row, if any
    block = next((size for size in (BLOCK, BLOCK // 2, BLOCK // 4) if row_size % size == 0), BLOCK)
    sizes = (n, row_size, batch, run, run_stride)
    flags = (scales[0] is not None, scales[1] is not None, runs is not None)
    device = tensors[0].device
    pointers = tuple(t.data_ptr() for t in tensors)
    key = (tuple(t.dtype for t in tensors), sizes, flags, block, tuple(p % _ALIGN for p in pointers))
    launch(kernel, handles, key, device.index if device.type == "cuda" else None, -(-n // block), tensors,
           pointers, (*sizes, *flags, block), NUM_WARPS)


def drop_path_sum_fwd(a: Tensor, b: Tensor, scale_a: Tensor | None, scale_b: Tensor | None, batch: int,
                      out: Tensor | None = None) -> Tensor:
    """a·s_a + b·s_b (a and b: one dense layout, first dim outermost; scales: [batch] or None), written to `out` (a
    tensor of a's strides or a slice of one, `slice_runs`), by default a new tensor of a's strides."""
    out = torch.empty_like(a) if out is None else out
    runs = None if out.stride() == a.stride() else slice_runs(out, a.stride())
    if out.stride() != a.stride() and runs is None:
        raise ValueError(f"drop_path_sum_fwd: an output of strides {out.stride()} for terms of {a.stride()}")
    if a.numel():
        _launch(_drop_path_sum_fwd_kernel, _FWD_HANDLES, (a, b, _or(scale_a, a), _or(scale_b, a), out), batch,
                (scale_a, scale_b), runs)
    return out


def slice_runs(g: Tensor, strides: tuple[int, ...]) -> tuple[int, int] | None:
    """(run, run stride) if g, of the terms' shape, is a slice of a larger tensor of the terms' layout along the dim
    after the runs (channels for channels_last terms, the first for the others): its elements, in the terms' flat
    order, are runs of `run` elements `run stride` apart. None for any other strides."""
    shape, found = g.shape, g.stride()
    if g.dim() == 4 and strides == (shape[1] * shape[2] * shape[3], 1, shape[3] * shape[1], shape[1]):
        stride = found[3]  # channels_last terms: a run is a pixel's channels
        if stride >= shape[1] and found == (shape[2] * shape[3] * stride, 1, shape[3] * stride, stride):
            return shape[1], stride
        return None
    inner = g[0].numel()  # contiguous terms: a run is a row
    if found[1:] == strides[1:] and found[0] >= inner and strides[0] == inner:
        return inner, found[0]
    return None


def drop_path_sum_bwd(g: Tensor, scale_a: Tensor | None, scale_b: Tensor | None, batch: int,
                      strides: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """(g·s_a, g·s_b) with the terms' `strides`; an unscaled term's gradient is g itself, or a copy of g in the
    terms' strides. g is read in place if it has the terms' strides or is a slice (`slice_runs`) of a tensor in
    their layout; any other g is copied into their strides first."""
    runs = None if g.stride() == strides else slice_runs(g, strides)
    if g.stride() != strides and runs is None:
        g = torch.empty_strided(g.shape, strides, dtype=g.dtype, device=g.device).copy_(g)

    def term_gradient(scale: Tensor | None) -> Tensor:
        if scale is None and runs is None:
            return g
        out = torch.empty_strided(g.shape, strides, dtype=g.dtype, device=g.device)
        return out.copy_(g) if scale is None else out

    grad_a, grad_b = term_gradient(scale_a), term_gradient(scale_b)
    if g.numel() and (scale_a is not None or scale_b is not None):
        _launch(_drop_path_sum_bwd_kernel, _BWD_HANDLES, (g, _or(scale_a, g), _or(scale_b, g), grad_a, grad_b), batch,
                (scale_a, scale_b), runs)
    return grad_a, grad_b


def _or(scale: Tensor | None, stand_in: Tensor) -> Tensor:
    """The scale, or a pointer that is never read (its term is unscaled: a constexpr skips the load)."""
    return stand_in if scale is None else scale
