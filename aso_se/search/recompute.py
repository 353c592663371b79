"""Per-cell activation recompute (``search.supernet.recompute``): activations recomputed in backward instead
of stored, with results and BatchNorm statistics unchanged."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint


@contextlib.contextmanager
def _frozen_batchnorm_statistics(module: nn.Module) -> Iterator[None]:
    """Recomputation normalizes as before but does not update BatchNorm's running statistics twice.

    Momentum 0 leaves ``running_mean``/``running_var`` unchanged and hiding ``num_batches_tracked``
    skips its increment: host-side attribute swaps, no extra kernels."""
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    saved = [(norm.momentum, norm.num_batches_tracked) for norm in norms]
    for norm in norms:
        norm.momentum, norm.num_batches_tracked = 0.0, None
    try:
        yield
    finally:
        for norm, (momentum, counter) in zip(norms, saved):
            norm.momentum, norm.num_batches_tracked = momentum, counter


class RecomputedCell(nn.Module):
    """Wraps a cell; with ``enabled`` its activations are recomputed in backward instead of stored.

    Built on torch's activation checkpointing: its non-reentrant mode accepts the host lists of active ops and
    inputs without grad; neurons restart from their initial state each forward, so the recomputation replays
    the same spikes.
    No-grad forwards run plain. The wrapper is always present, so state_dict keys don't depend on ``enabled``.
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
