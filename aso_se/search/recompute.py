"""Per-cell activation checkpointing that leaves results and BatchNorm statistics unchanged."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint


@contextlib.contextmanager
def _frozen_batchnorm_statistics(module: nn.Module) -> Iterator[None]:
    """While recomputing, BatchNorm must normalize exactly as before (batch statistics, and the
    same tensors saved for backward, which checkpoint verifies) without updating its running
    statistics a second time. A momentum of 0 leaves ``running_mean``/``running_var`` unchanged
    (``(1 - 0)·running + 0·batch``); hiding ``num_batches_tracked`` skips its increment. Both are
    attribute swaps on the host: no extra kernels."""
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    saved = [(norm.momentum, norm.num_batches_tracked) for norm in norms]
    for norm in norms:
        norm.momentum, norm.num_batches_tracked = 0.0, None
    try:
        yield
    finally:
        for norm, (momentum, counter) in zip(norms, saved):
            norm.momentum, norm.num_batches_tracked = momentum, counter


class MemoryEfficientCell(nn.Module):
    """Wraps a cell; with ``enabled`` its activations are recomputed in backward instead of stored.

    Uses ``torch.utils.checkpoint`` with ``use_reentrant=False`` (works with non-tensor arguments
    such as the host lists of active ops, and with inputs that don't require grad) and
    ``preserve_rng_state=True`` (anything random inside replays identically; our neurons and ops
    draw nothing, the Gumbel noise is an input). Spiking neurons restart from their initial
    state on every forward, so the recomputation sees the same membrane trajectory. Only
    checkpoints while autograd records; no-grad forwards run plain. The wrapper is always
    present, so the state_dict keys don't depend on ``enabled``.
    """

    def __init__(self, cell: nn.Module, enabled: bool = False) -> None:
        super().__init__()
        self.cell = cell
        self.enabled = enabled

    def forward(self, *args: Any) -> Tensor:
        if not (self.enabled and torch.is_grad_enabled()):
            return self.cell(*args)
        return checkpoint(
            self.cell,
            *args,
            use_reentrant=False,
            preserve_rng_state=True,
            context_fn=lambda: (contextlib.nullcontext(), _frozen_batchnorm_statistics(self.cell)),
        )

    def extra_repr(self) -> str:
        return f"enabled={self.enabled}"
