"""Averaging gradients across processes for the search, without DistributedDataParallel.

Why not DDP: each step runs a different sampled subset of the supernet's ops, so DDP would need
``find_unused_parameters=True`` (a graph traversal and an extra reduction of unused flags every
step), would have to be rebuilt whenever structure evolution grows the supernet, and would need
``no_sync`` bookkeeping around the extra forward/backward passes of the second-order α step.
Instead every rank draws the SAME ops (one Gumbel generator seeded identically on all ranks,
and α kept identical), so the same parameters have gradients everywhere; after each backward
their gradients are flattened into ONE buffer and averaged with ONE all-reduce per parameter
group (weights, α). Identical averaged α gradients and identical optimizers keep α bitwise
identical on all ranks.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn


def distributed_world_size() -> int:
    """The number of processes when torch.distributed is initialized, else 1."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_gradients(params: Iterable[nn.Parameter]) -> None:
    """Averages the ``.grad`` of ``params`` over all processes in one collective (no-op alone)."""
    world_size = distributed_world_size()
    if world_size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    dist.all_reduce(flat)
    flat.div_(world_size)
    for grad, averaged in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(averaged.view_as(grad))


def broadcast_module(module: nn.Module) -> None:
    """Copies rank 0's parameters and buffers to every process (no-op alone)."""
    if distributed_world_size() == 1:
        return
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, src=0)


def check_identical_across_ranks(tensor: torch.Tensor, what: str) -> None:
    """Raises on every rank if ``tensor`` differs between processes (no-op alone): one all-reduce
    (MAX) of ± two checksums, plain and position-weighted. The engine calls it once per cycle on
    α, whose equality on all ranks the genotype derivation relies on."""
    if distributed_world_size() == 1:
        return
    flat = tensor.detach().reshape(-1).double()
    positions = torch.arange(1, flat.numel() + 1, device=flat.device, dtype=flat.dtype)
    sums = torch.stack([flat.sum(), (flat * positions).sum()])
    extremes = torch.cat([sums, -sums])
    gathered = extremes.clone()
    dist.all_reduce(gathered, op=dist.ReduceOp.MAX)
    if not torch.equal(gathered, extremes):  # another rank's checksum is larger or smaller
        raise RuntimeError(f"{what} differs between processes (rank {dist.get_rank()}): the ranks "
                           f"no longer draw the same ops; this is a bug, please report it")
