"""Triton kernels of a weighted sum of up to MAX_TERMS same-layout tensors, and their launchers.

Each program takes BLOCK elements in memory order (the terms share their strides, so one flat offset addresses
each term). Forward: out = Σ w_i · t_i, accumulated in fp32. Backward, one pass over the output's gradient g:
grad t_i = w_i · g, each into a tensor of its own (e.g. a buffer the caller names), and, when asked, each
program's fp32 partial of grad w_i = Σ t_i · g, summed over programs by the caller (deterministic, no atomics).
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.launch import Handle, launch

MAX_TERMS = 10  # a DARTS node with 4 steps and top-2 ops reads up to 5 edges × 2 ops
BLOCK = 2048
NUM_WARPS = 4


@triton.jit
def _term(t_ptr, offs, mask):
    return tl.load(t_ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _wsum_fwd_kernel(out_ptr, w_ptr, t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, N,
                     K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.load(w_ptr).to(tl.float32) * _term(t0, offs, mask)
    if K > 1:
        acc += tl.load(w_ptr + 1).to(tl.float32) * _term(t1, offs, mask)
    if K > 2:
        acc += tl.load(w_ptr + 2).to(tl.float32) * _term(t2, offs, mask)
    if K > 3:
        acc += tl.load(w_ptr + 3).to(tl.float32) * _term(t3, offs, mask)
    if K > 4:
        acc += tl.load(w_ptr + 4).to(tl.float32) * _term(t4, offs, mask)
    if K > 5:
        acc += tl.load(w_ptr + 5).to(tl.float32) * _term(t5, offs, mask)
    if K > 6:
        acc += tl.load(w_ptr + 6).to(tl.float32) * _term(t6, offs, mask)
    if K > 7:
        acc += tl.load(w_ptr + 7).to(tl.float32) * _term(t7, offs, mask)
    if K > 8:
        acc += tl.load(w_ptr + 8).to(tl.float32) * _term(t8, offs, mask)
    if K > 9:
        acc += tl.load(w_ptr + 9).to(tl.float32) * _term(t9, offs, mask)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _term_bwd(i: tl.constexpr, t_ptr, gt_ptr, g, offs, mask, w_ptr, partial_ptr,
              K: tl.constexpr, GRAD_T: tl.constexpr, GRAD_W: tl.constexpr):
    if GRAD_T:
        w = tl.load(w_ptr + i).to(tl.float32)
        tl.store(gt_ptr + offs, (w * g).to(gt_ptr.dtype.element_ty), mask=mask)
    if GRAD_W:
        tl.store(partial_ptr + tl.program_id(0) * K + i, tl.sum(_term(t_ptr, offs, mask) * g, axis=0))


@triton.jit
def _wsum_bwd_kernel(g_ptr, w_ptr, partial_ptr, t0, t1, t2, t3, t4, t5, t6, t7, t8, t9,
                     gt0, gt1, gt2, gt3, gt4, gt5, gt6, gt7, gt8, gt9, N,
                     K: tl.constexpr, GRAD_T: tl.constexpr, GRAD_W: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    _term_bwd(0, t0, gt0, g, offs, mask, w_ptr, partial_ptr, K, GRAD_T, GRAD_W)
    if K > 1:
        _term_bwd(1, t1, gt1, g, offs, mask, w_ptr, partial_ptr, K, GRAD_T, GRAD_W)
    if K > 2:
        _term_bwd(2, t2, gt2, g, offs, mask, w_ptr, partial_ptr, K, GRAD_T, GRAD_W)
    if K > 3:
        _term_bwd(3, t3, gt3, g, offs, mask, w_ptr, partial_ptr, K, GRAD_T, GRAD_W)
    if K > 4:
        _term_bwd(4, t4, gt4, g, offs, mask, w_ptr, partial_ptr, K, GRAD_T, GRAD_W)
    if K > 5:
        _term_bwd(5, t5, gt5, g, offs, mask, w_ptr, partial_ptr, K, GRAD_T, GRAD_W)
    if K > 6:
        _term_bwd(6, t6, gt6, g, offs, mask, w_ptr, partial_ptr, K, GRAD_T, GRAD_W)
    if K > 7:
        _term_bwd(7, t7, gt7, g, offs, mask, w_ptr, partial_ptr, K, GRAD_T, GRAD_W)
    if K > 8:
        _term_bwd(8, t8, gt8, g, offs, mask, w_ptr, partial_ptr, K, GRAD_T, GRAD_W)
    if K > 9:
        _term_bwd(9, t9, gt9, g, offs, mask, w_ptr, partial_ptr, K, GRAD_T, GRAD_W)


# Compiled launches kept by key (kernels/launch.py): later calls skip JITFunction.run's per-call binding.
_FWD_HANDLES: dict[tuple, Handle] = {}
_BWD_HANDLES: dict[tuple, Handle] = {}
_ALIGN = 16  # Triton specializes pointers on their alignment to this many bytes


def _padded(terms: list[Tensor]) -> list[Tensor]:
    """The terms, then the first one again in the unused pointer slots (never read: K is a constexpr)."""
    return terms + [terms[0]] * (MAX_TERMS - len(terms))


def _launch(kernel, handles: dict, tensors: list[Tensor], n: int, flags: tuple) -> None:
    device = tensors[0].device
    pointers = tuple(t.data_ptr() for t in tensors)
    key = (tuple(t.dtype for t in tensors), n, flags, tuple(p % _ALIGN for p in pointers))
    launch(kernel, handles, key, device.index if device.type == "cuda" else None, -(-n // BLOCK), tuple(tensors),
           pointers, (n, *flags, BLOCK), NUM_WARPS)


def weighted_sum_fwd(terms: list[Tensor], weights: Tensor, out: Tensor) -> None:
    """out (same strides as each term) = Σ weights[i] · terms[i]; weights: contiguous 1-d, float."""
    n = out.numel()
    if n:
        _launch(_wsum_fwd_kernel, _FWD_HANDLES, [out, weights, *_padded(terms)], n, (len(terms),))


def weighted_sum_bwd(grad: Tensor, weights: Tensor, terms: list[Tensor] | None, num_terms: int,
                     grad_terms: list[Tensor] | None) -> Tensor | None:
    """Writes weights[i] · grad into grad_terms[i] (when given; each with grad's strides); returns the fp32
    gradient of the weights ([K]) when ``terms`` (the forward's, same strides as grad) are given, else None."""
    n = grad.numel()
    grad_w = terms is not None
    if n == 0:
        return torch.zeros(num_terms, device=grad.device, dtype=torch.float32) if grad_w else None
    programs = -(-n // BLOCK)
    partials = torch.empty((programs, num_terms), device=grad.device, dtype=torch.float32) if grad_w else None
    _launch(_wsum_bwd_kernel, _BWD_HANDLES,
            [grad, weights, grad if partials is None else partials, *_padded(terms if grad_w else [grad]),
             *_padded(grad_terms if grad_terms is not None else [grad])], n,
            (num_terms, grad_terms is not None, grad_w))
    return partials.sum(dim=0) if grad_w else None
