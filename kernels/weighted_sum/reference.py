"""Readable reference of the weighted sum, ``Σ w_i · t_i`` accumulated in fp32: what the kernels compute."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def weighted_sum_reference(terms: Sequence[Tensor], weights: Tensor) -> Tensor:
    """``Σ weights[i] · terms[i]`` in fp32 (the readable reference of the kernels; float64 stays float64)."""
    dtype = torch.promote_types(torch.float32, terms[0].dtype)
    total = weights[0].to(dtype) * terms[0].to(dtype)
    for w, t in zip(weights[1:], terms[1:]):
        total = total + w.to(dtype) * t.to(dtype)
    return total

