"""Per-step scalars brought to the host without stalling the GPU.

Each step's scalars (losses, accuracies, entropy: 0-dim device tensors) are stacked into one
small tensor and copied to pinned host memory with ``non_blocking=True`` behind a CUDA event.
They are handed out once the copy has landed (usually a step later), so logging every step
costs two tiny launches and no host sync; ``drain(wait=True)`` (epoch end, stop) blocks.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class _Pending:
    info: dict[str, Any]
    names: tuple[str, ...]
    values: Tensor
    copied: torch.cuda.Event | None


class AsyncStepMetrics:
    """A FIFO of per-step metrics whose device scalars are on their way to the host."""

    def __init__(self) -> None:
        self._pending: deque[_Pending] = deque()

    def push(self, info: dict[str, Any], device_scalars: dict[str, Tensor]) -> None:
        """``info``: host values (step, lr, ...); ``device_scalars``: 0-dim tensors, copied asynchronously."""
        stacked = torch.stack([value.detach().float() for value in device_scalars.values()])
        copied = None
        if stacked.is_cuda:
            values = torch.empty(stacked.shape, pin_memory=True)
            values.copy_(stacked, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        else:
            values = stacked
        self._pending.append(_Pending(info, tuple(device_scalars), values, copied))

    def drain(self, wait: bool = False) -> list[dict[str, Any]]:
        """The metrics whose copies have landed (all of them with ``wait``), oldest first, as flat dicts."""
        ready = []
        while self._pending and (wait or self._pending[0].copied is None or self._pending[0].copied.query()):
            pending = self._pending.popleft()
            if pending.copied is not None:
                pending.copied.synchronize()
            ready.append({**pending.info, **dict(zip(pending.names, pending.values.tolist()))})
        return ready
