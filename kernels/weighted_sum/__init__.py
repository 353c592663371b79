"""A weighted sum of same-shaped tensors, ``Σ w_i · t_i`` with a 1-d ``w``, as one Triton kernel each way: public API.

Why: a node of the supernet sums its 4–10 sampled op outputs with their edge weights. Written with PyTorch ops
(stack, then a matrix-vector product) that is a copy of every term plus cuBLAS calls, whose host time per call is
a large part of the host-bound graphed search step (RESULTS.md, "Search step"). Here one kernel reads each term
once in forward; one kernel gives every term's gradient and the weights' gradient in backward.

``weighted_sum(terms, weights)`` gives the terms' dtype (autocast's where it is on, as ``weights @ stack(terms)``
would), keeps the terms' memory layout (e.g. channels_last), and on CUDA ("auto") takes the kernels when the terms
share dtype and strides and there are at most ``MAX_TERMS``; elsewhere PyTorch's ops, in the same memory order.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from kernels.backend import BACKENDS, use_triton
from kernels.memory_order import storage_order

from .function import TorchWeightedSum, TritonWeightedSum
from .reference import weighted_sum_reference
from .triton import MAX_TERMS

__all__ = ["BACKENDS", "MAX_TERMS", "weighted_sum", "weighted_sum_reference"]


def _use_triton(terms: Sequence[Tensor], backend: str) -> bool:
    first = terms[0]
    fits = (2 <= len(terms) <= MAX_TERMS and first.is_floating_point() and first.dim() > 0
            and (first.is_contiguous() or storage_order(first) is not None)
            and all(t.dtype == first.dtype and t.stride() == first.stride() and t.device == first.device
                    for t in terms[1:]))
    problem = None if fits else (f"the Triton weighted sum takes 2 to {MAX_TERMS} float terms of one dtype and one "
                                 "dense layout")
    return use_triton(backend, "weighted_sum", first.device, problem)


def weighted_sum(terms: Sequence[Tensor], weights: Tensor, backend: str = "auto",
                 grad_buffers: Sequence[Tensor | None] | None = None, out: Tensor | None = None) -> Tensor:
    """``sum(w * t for w, t in zip(weights, terms))`` for same-shaped ``terms`` and a 1-d ``weights``.

    Buffers the kernels may use, so that a caller that would copy into such a buffer anyway (a CUDA graph's
    input) need not; each must have the term's shape and strides and the dtype it would get, else it is ignored
    (as are all on PyTorch's path). ``grad_buffers`` (one per term, or None): where a term's gradient is written,
    handed back as that gradient. ``out``: where the sum is written; the result then shares its memory.
    """
    if len(terms) == 1:
        return weights[0] * terms[0]
    if _use_triton(terms, backend) and not torch.compiler.is_compiling():
        return TritonWeightedSum.apply(weights, grad_buffers, out, *terms)
    return TorchWeightedSum.apply(weights, *terms)
