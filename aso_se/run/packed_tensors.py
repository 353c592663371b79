"""A nested state's tensors packed into one flat tensor per (device, dtype), and back.

``torch.save`` pays per tensor (pickling, and a device-to-host copy each on a GPU) and per pickled
object; a search engine's state holds ~10,000 small tensors, so each epoch-end checkpoint cost rank 0
about a second that every other rank waited for. Packed, the file holds a few large tensors, one
table of int64 rows (group, offset, ndim, shape, dims in storage order) and a 2-tuple placeholder per
tensor, all of which ``torch.load(weights_only=True)`` reads. Layouts survive (a channels_last
tensor comes back channels_last); a tensor that is not dense (overlapping, or with holes) is kept as is.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

_MARK = "aso_se_packed_tensor"  # a placeholder: (_MARK, row of the table)
_ATOMIC = frozenset({int, float, str, bool, type(None)})  # returned as they are, before the slower checks
_DESCEND = object()  # a converter's answer: not a leaf of mine, look inside


def pack(state: Any) -> tuple[Any, dict[str, Any]]:
    """(``state`` with its dense tensors replaced by placeholders, {"flats": one flat tensor per (device,
    dtype), "table": each placeholder's int64 row}); the flats stay on their devices."""
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    sizes: dict[tuple[torch.device, torch.dtype], int] = {}
    indices: dict[tuple[torch.device, torch.dtype], int] = {}
    rows: list[list[int]] = []

    def placeholder(value: Any) -> Any:
        if not isinstance(value, Tensor):
            return _DESCEND
        contiguous = value.is_contiguous()  # the common case, in one call (thousands of tensors)
        order = list(range(value.dim())) if contiguous else _storage_order(value)
        if order is None:
            return value
        key = (value.device, value.dtype)
        if key not in groups:
            groups[key], sizes[key], indices[key] = [], 0, len(indices)
        offset = sizes[key]
        groups[key].append(value.view(-1) if contiguous else value.permute(order).reshape(-1))
        sizes[key] = offset + value.numel()
        rows.append([indices[key], offset, value.dim(), *value.shape, *order])
        return (_MARK, len(rows) - 1)

    with torch.no_grad():
        skeleton = _rebuild(state, placeholder)
        width = max((len(row) for row in rows), default=0)
        padded = [row + [-1] * (width - len(row)) for row in rows]
        table = torch.tensor(padded, dtype=torch.int64).reshape(len(rows), width)
        return skeleton, {"flats": [torch.cat(members) for members in groups.values()], "table": table}


def unpack(skeleton: Any, packed: Mapping[str, Any]) -> Any:
    """The state that `pack` was given, each tensor with its own storage (on the flats' devices)."""
    flats, rows = packed["flats"], packed["table"].tolist()

    def tensor(value: Any) -> Any:
        if not (isinstance(value, tuple) and len(value) == 2 and value[0] == _MARK):
            return _DESCEND
        group, offset, ndim, *rest = rows[value[1]]
        shape, order = rest[:ndim], rest[ndim:2 * ndim]
        stored = flats[group][offset:offset + math.prod(shape)].view([shape[dim] for dim in order])
        inverse = sorted(range(ndim), key=order.__getitem__)
        return stored.permute(inverse).clone(memory_format=torch.preserve_format)

    return _rebuild(skeleton, tensor)


def loose_tensors_to_host(skeleton: Any) -> Any:
    """``skeleton`` (from `pack`) with each tensor that `pack` kept as it is (not dense) copied to the host, its
    layout kept: nothing left in it shares memory with the packed state."""

    def copy(value: Any) -> Any:
        if not isinstance(value, Tensor):
            return _DESCEND
        storage = value.untyped_storage()
        storage = storage.clone() if storage.device.type == "cpu" else storage.cpu()
        return torch.empty(0, dtype=value.dtype).set_(storage, value.storage_offset(), value.size(), value.stride())

    return _rebuild(skeleton, copy)


def _rebuild(value: Any, convert: Callable[[Any], Any]) -> Any:
    """``value`` with ``convert`` applied to each value in it (nested dicts, lists, tuples kept with their
    types); where ``convert`` returns ``_DESCEND``, into the container."""
    if type(value) in _ATOMIC:
        return value
    converted = convert(value)
    if converted is not _DESCEND:
        return converted
    if isinstance(value, Mapping):
        items = [(key, _rebuild(item, convert)) for key, item in value.items()]
        return OrderedDict(items) if isinstance(value, OrderedDict) else dict(items)
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild(item, convert) for item in value)
    return value


def _storage_order(tensor: Tensor) -> list[int] | None:
    """The dims from outermost to innermost in memory, if the tensor is dense in that order; else None."""
    if tensor.layout is not torch.strided or tensor.is_quantized:
        return None
    order = sorted(range(tensor.dim()), key=lambda dim: (-tensor.stride(dim), dim))
    return order if tensor.permute(order).is_contiguous() else None
