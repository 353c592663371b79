"""torchrun / DistributedDataParallel set-up shared by search.py and train.py.

One process per GPU, started by ``torchrun --nproc_per_node=N <entry point> trainer=ddp``:
NCCL between GPUs, gloo on CPU (how the tests run two ranks). Rank 0 alone logs, writes
TensorBoard events and checkpoints. The retrain network is wrapped in DDP here; the search
engine averages its own gradients (its sampled sub-graph changes every step, which DDP's
fixed bucket plan does not fit), so the supernet is never wrapped.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from search_space.errors import UserInputError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class DistributedContext:
    """Where this process runs and which rank it is (rank 0 of 1 when not distributed)."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    # CPU-side group for tiny control messages (the stop flag): a gloo all-reduce of a CPU
    # tensor never waits for the CUDA stream, so polling it every step costs no GPU sync.
    control_group: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(device: str) -> torch.device:
    """``auto`` is CUDA when present, else the CPU; asking for CUDA without one is a user error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserInputError(f"trainer.device={device} but no CUDA device is visible; "
                             f"use trainer.device=cpu or trainer.device=auto")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise UserInputError(f"trainer.device={device} is not a device; "
                             f"use auto, cpu, cuda or cuda:<index>") from err


def init_distributed(*, ddp: bool, device: str) -> DistributedContext:
    """Join the torchrun process group when ``ddp`` (trainer=ddp), else run as a single process."""
    launched_world = int(os.environ.get("WORLD_SIZE", "1"))
    if not ddp:
        if launched_world > 1:
            raise UserInputError(f"torchrun started {launched_world} processes but the trainer is "
                                 f"not distributed; add trainer=ddp")
        return DistributedContext(device=resolve_device(device))
    if "RANK" not in os.environ or "LOCAL_RANK" not in os.environ:
        raise UserInputError("trainer=ddp needs torchrun to start the processes: "
                             "torchrun --nproc_per_node=<N> <search.py|train.py> trainer=ddp")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    resolved = resolve_device(device)
    if resolved.type == "cuda":
        resolved = torch.device("cuda", local_rank)
        torch.cuda.set_device(resolved)
    backend = "nccl" if resolved.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, device_id=resolved if backend == "nccl" else None)
    control_group = dist.new_group(backend="gloo") if backend == "nccl" else dist.group.WORLD
    return DistributedContext(device=resolved, rank=rank, world_size=dist.get_world_size(),
                              local_rank=local_rank, control_group=control_group)


def shutdown_distributed(ctx: DistributedContext) -> None:
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_from_main(value: T, ctx: DistributedContext) -> T:
    """Rank 0's ``value`` on every rank (any picklable object)."""
    if not ctx.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=ctx.control_group)
    return box[0]


def any_rank(flag: bool, ctx: DistributedContext) -> bool:
    """True on every rank when ``flag`` is true on any rank, so all ranks stop at the same step."""
    if not ctx.distributed:
        return flag
    votes = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=ctx.control_group)
    return bool(votes.item())


def wrap_model(model: nn.Module, ctx: DistributedContext) -> nn.Module:
    """The retrain network, in DDP when distributed (gradients averaged in the backward pass)."""
    if not ctx.distributed:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def unwrap_model(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model
