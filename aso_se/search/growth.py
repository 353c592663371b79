"""Structure evolution, the growing half: deeper and/or wider supernets that compute the same function.

Depth: a grown cell outputs ``s1 + gate * cell(s0, s1)`` with ``gate = 0`` and passes ``s0`` through, so
later cells see their old inputs, yet the gate's gradient trains the new cell at once (as ReZero).
Width: channel counts are multiplied by an integer factor, each old channel repeated in place
(:func:`widen_tensor`); that one mapping agrees with every concatenation in the network (cell outputs,
FactorizedReduce's halves), so each tensor transforms on its own. New modules are initialized under a
caller-given seed, so a resumed search grows the same supernet; optimizer state follows its parameters.
"""
from __future__ import annotations

import re
from typing import Callable

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from aso_se.search.supernet import SearchNetwork, SupernetStructure

# A parameter/buffer name of the grown supernet -> its name in the old one (None: a new module).
NameMap = Callable[[str], "str | None"]


def grow_structure(
    structure: SupernetStructure, new_cells: int, width_factor: int
) -> tuple[SupernetStructure, list[int]]:
    """The grown structure and, for every old cell, its position in the new one.

    Each new cell goes to the end of the stage (a reduction cell and the cells up to the next)
    with the fewest cells, the earliest on ties. An empty first stage (the network starts with
    a reduction cell) takes none: a grown cell adds to the output of the cell before it.
    """
    if width_factor < 1 or new_cells < 0:
        raise ValueError(f"width_factor={width_factor} must be >= 1 and new_cells={new_cells} >= 0")
    stages: list[list[tuple[str, int | None]]] = [[]]
    for old_position, kind in enumerate(structure.cells):
        if kind == "reduction":
            stages.append([])
        stages[-1].append((kind, old_position))
    open_stages = [stage for stage in stages if stage]
    for _ in range(new_cells):
        min(open_stages, key=len).append(("grown", None))
    cells = [cell for stage in stages for cell in stage]
    new_positions = [0] * len(structure.cells)
    for new_position, (_, old_position) in enumerate(cells):
        if old_position is not None:
            new_positions[old_position] = new_position
    grown = SupernetStructure(structure.channels * width_factor, tuple(kind for kind, _ in cells))
    return grown, new_positions


def widen_tensor(old: Tensor, new_shape: torch.Size, factor: int) -> Tensor:
    """``old`` mapped onto ``new_shape``: new channel ``j`` is a copy of old channel ``j // factor``.

    Output-channel dims (dim 0, every 1-D tensor) are repeated; input-channel dims (dim 1 of a conv or
    linear weight) keep the weights on each channel's first copy and zeros on the others, so every
    layer's output, BatchNorm statistics and spikes are unchanged. Unlike Net2Net's even split, the
    zeros let training pull the copies apart. Raises ValueError if a dim grows by other than ``factor``.
    """
    out = old
    for dim, (old_size, new_size) in enumerate(zip(old.shape, new_shape)):
        if new_size == old_size:
            continue
        if new_size != factor * old_size:
            raise ValueError(f"cannot widen a tensor of shape {tuple(old.shape)} to {tuple(new_shape)} by {factor}")
        if dim == 0 or old.dim() == 1:
            out = out.repeat_interleave(factor, dim=dim)
        else:  # an input-channel dim: the first copy of each channel keeps the weights
            spread = out.new_zeros(*out.shape[:dim], new_size, *out.shape[dim + 1:])
            spread[(slice(None),) * dim + (slice(0, None, factor),)] = out
            out = spread
    return out


def grow_supernet(
    net: SearchNetwork, *, new_cells: int, width_factor: int, seed: int
) -> tuple[SearchNetwork, NameMap]:
    """A deeper and/or wider supernet computing the same function as ``net``, and its names' map to ``net``'s."""
    structure, new_positions = grow_structure(net.structure, new_cells, width_factor)
    old_cell_at = {new: old for old, new in enumerate(new_positions)}

    def old_name(name: str) -> str | None:
        match = re.match(r"cells\.(\d+)\.(.*)", name)
        if match is None:
            return name
        old = old_cell_at.get(int(match.group(1)))
        return None if old is None else f"cells.{old}.{match.group(2)}"

    devices = [net.classifier.weight.device] if net.classifier.weight.is_cuda else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        grown = net.with_structure(structure)
    old_state = net.state_dict()
    with torch.no_grad():
        for name, tensor in grown.state_dict().items():
            source = old_name(name)
            if source is not None:
                tensor.copy_(widen_tensor(old_state[source], tensor.shape, width_factor))
    grown.train(net.training)
    return grown, old_name


def rebind_optimizer(
    old_optimizer: Optimizer, new_optimizer: Optimizer, old_net: nn.Module, new_net: nn.Module,
    old_name: NameMap, width_factor: int,
) -> None:
    """Carries ``old_optimizer``'s hyper-parameters (lr as scheduled so far) and per-parameter state
    over to ``new_optimizer`` (same param groups, over ``new_net``'s parameters), state tensors
    mapped like their parameters. Parameters of new modules start with no state."""
    for old_group, new_group in zip(old_optimizer.param_groups, new_optimizer.param_groups):
        new_group.update({key: value for key, value in old_group.items() if key != "params"})
    old_params = dict(old_net.named_parameters())
    for name, param in new_net.named_parameters():
        source = old_name(name)
        if source is None or old_params[source] not in old_optimizer.state:
            continue
        old_param = old_params[source]
        new_optimizer.state[param] = {
            key: widen_tensor(value, param.shape, width_factor) if _shaped_like(value, old_param) else value
            for key, value in old_optimizer.state[old_param].items()
        }


def _shaped_like(value: object, param: Tensor) -> bool:
    """A per-element state tensor (momentum, Adam moments), as opposed to a step count."""
    return torch.is_tensor(value) and value.shape == param.shape
