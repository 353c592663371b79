"""Running an op that is elementwise but for its first dim on a tensor's memory order.

A channels_last ``[T*B, C, H, W]`` (or its ``[T, B, C, H, W]`` view) is dense but not contiguous; a kernel
that wants a contiguous input would copy it. Permuted to its memory order it is a contiguous view, so
such an op (a neuron over time, a weighted sum of same-layout terms) can run there and hand back a
result with the input's strides, with no copy either way.
"""
from __future__ import annotations

from typing import Callable

from torch import Tensor

_ORDERS: dict[tuple, tuple[int, ...] | None] = {}  # (shape, strides) -> storage_order: a few per network
_MAX_ORDERS = 4096


def storage_order(x: Tensor) -> tuple[int, ...] | None:
    """Dim 0 first, then the other dims by falling stride, when that permutation of a dense ``x`` is
    contiguous and not the identity (a channels_last ``[T, B, C, H, W]``: (0, 1, 3, 4, 2)); else None.
    Kept per shape and strides, which decide it: the search step asks hundreds of times per step."""
    key = (x.shape, x.stride())
    order = _ORDERS.get(key, False)
    if order is False:
        strides = key[1]
        order = (0, *sorted(range(1, x.dim()), key=lambda dim: -strides[dim]))
        order = order if order != tuple(range(x.dim())) and x.permute(order).is_contiguous() else None
        if len(_ORDERS) < _MAX_ORDERS:
            _ORDERS[key] = order
    return order


def inverse_order(order: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that undoes ``permute(order)``."""
    return tuple(order.index(dim) for dim in range(len(order)))


def in_storage_order(fn: Callable[[Tensor], Tensor], x: Tensor, order: tuple[int, ...]) -> Tensor:
    """``fn(x)`` run on ``x.permute(order)`` (from :func:`storage_order`), permuted back to ``x``'s dims."""
    return fn(x.permute(order)).permute(inverse_order(order))
