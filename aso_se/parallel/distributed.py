"""torchrun / DistributedDataParallel set-up shared by search.py and train.py.

One process per GPU, started by ``torchrun --nproc_per_node=N <entry point> trainer=ddp``:
NCCL between GPUs, gloo on CPU (how the tests run two ranks). Rank 0 alone logs, writes
TensorBoard events and checkpoints. The retrain network is wrapped in DDP here; the search
engine averages its own gradients (its sampled sub-graph changes every step, which DDP's
fixed bucket plan does not fit), so the supernet is never wrapped.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import warnings
from typing import Any, Iterable, TypeVar

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


def init_distributed(*, ddp: bool, device: str, peer_timeout_s: float = 300.0) -> DistributedContext:
    """Join the torchrun process group when ``ddp`` (trainer=ddp), else run as a single process.

    A collective waits at most ``peer_timeout_s`` for a rank that hangs; a rank that dies fails
    the others' next collective at once (`is_peer_failure` recognizes both)."""
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
    timeout = datetime.timedelta(seconds=peer_timeout_s)
    store = _store_of_this_attempt(timeout)
    placement = {"store": store, "rank": rank, "world_size": int(os.environ["WORLD_SIZE"])} if store else {}
    dist.init_process_group(backend=backend, device_id=resolved if backend == "nccl" else None, timeout=timeout,
                            **placement)
    control_group = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else dist.group.WORLD
    return DistributedContext(device=resolved, rank=rank, world_size=dist.get_world_size(),
                              local_rank=local_rank, control_group=control_group)


# How gloo and NCCL word a collective that lost its peer (gloo raises plain RuntimeErrors).
_PEER_FAILURE_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Timed out", "timed out",
                         "/gloo/", "NCCL")


def is_peer_failure(err: BaseException) -> bool:
    """True for a collective that failed because another rank died or stopped answering."""
    if isinstance(err, dist.DistError):  # DistBackendError, DistNetworkError, DistStoreError
        return True
    return isinstance(err, RuntimeError) and any(marker in str(err) for marker in _PEER_FAILURE_MARKERS)


def _store_of_this_attempt(timeout: datetime.timedelta) -> dist.Store | None:
    """torchrun's own store, its keys prefixed by the restart count on one node (else None: env://).

    torchrun shares its rendezvous store with the workers and keeps it across ``--max-restarts``:
    a restarted process group would read the last attempt's addresses and hang (pytorch#135712).
    Restart counts agree only on one node; across nodes torchrun needs
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which gives every attempt a store of its own."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if os.environ.get("LOCAL_WORLD_SIZE") != os.environ.get("WORLD_SIZE"):
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
            warnings.warn("torchrun --max-restarts across nodes: set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for "
                          "torchrun, or a restarted job waits on the last attempt's addresses (pytorch#135712)",
                          stacklevel=2)
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                timeout=timeout)
    return dist.PrefixStore(f"aso_se/attempt_{attempt}", agent_store)


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


# The search's gradient averaging: every rank draws the same ops, so the same parameters have
# gradients everywhere; one flattened all-reduce per parameter group (DDP would need
# find_unused_parameters and a rebuild after every growth of the supernet).

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
    # one foreach copy back: a search's sampled ops leave ~1,000 gradients, a copy_ call each cost host time
    parts = flat.split([grad.numel() for grad in grads])
    torch._foreach_copy_(grads, [part.view_as(grad) for grad, part in zip(grads, parts)])


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
