"""How much of the dense work a call's input leaves to the sparse kernels: `work_fractions` measures it on the
device, and a call site's `DensityTracker` reads it back without a host sync (what "auto" decides on)."""
from __future__ import annotations

import torch

from kernels.sparse_conv.geometry import ConvGeometry, cdiv
from kernels.sparse_conv.prescan import tile_activity
from kernels.sparse_conv.triton import (
    DEFAULT_CONFIG,
    KernelConfig,
    depthwise_activity,
    forward_counts,
    forward_lists,
)
from kernels.sparse_conv.wgrad import wgrad_chunk


class DensityTracker:
    """The work fractions last measured at one call site, read back without a host sync."""

    def __init__(self) -> None:
        self.forward: float | None = None  # fraction of the dense forward work
        self.wgrad: float | None = None  # fraction of the dense weight-gradient work
        self._pending: tuple[torch.Tensor, torch.cuda.Event] | None = None
        self._calls = 0

    def __reduce__(self):  # copies and pickles start afresh: events and pinned buffers do not travel
        return DensityTracker, ()

    def poll(self) -> None:
        """Take a finished measurement, if any (never waits)."""
        if self._pending is not None and self._pending[1].query():
            self.forward, self.wgrad = self._pending[0].tolist()
            self._pending = None

    def sample_due(self, every: int, now: bool = False) -> bool:
        """Counts a call; true on every `every`-th call (the first included), or whenever `now`,
        if no measurement is in flight."""
        self._calls += 1
        return (now or (self._calls - 1) % every == 0) and self._pending is None

    def record(self, fractions: torch.Tensor) -> None:
        """Reads `fractions` (forward, wgrad) back: a CUDA tensor asynchronously (`poll` takes it
        once it has arrived), a CPU one at once."""
        if not fractions.is_cuda:
            self.forward, self.wgrad = fractions.tolist()
            return
        host = torch.empty(fractions.shape, dtype=fractions.dtype, pin_memory=True)
        host.copy_(fractions, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending = (host, event)


def _any_per_chunk(active: torch.Tensor, chunk: int) -> torch.Tensor:
    """Fraction of the (sample, tile, chunk of `chunk` channels) groups of `active` [N, tiles, C]
    with any active channel."""
    padded = torch.nn.functional.pad(active, (0, -active.shape[2] % chunk))
    return padded.view(*active.shape[:2], -1, chunk).amax(dim=3).float().mean()


def work_fractions(x: torch.Tensor, blocks: torch.Tensor, geometry: ConvGeometry,
                   config: KernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """float32 [2] on the device: the fraction of the dense work that the forward and the
    weight-gradient kernels do on input x with block map `blocks` (what their run time is
    linear in). `geometry` has the 8x8 tiles of the weight-gradient kernels."""
    chunk = wgrad_chunk(geometry, config)
    wgrad = _any_per_chunk(tile_activity(blocks, geometry)[0], chunk)
    if geometry.is_depthwise:  # each silent channel of a tile is skipped on its own
        forward = depthwise_activity(x, blocks, geometry, config)[1].float().mean()
    else:
        count = forward_counts(x, forward_lists(x, blocks, geometry, config))
        block_k = config.forward_block_k
        forward = torch.div(count + block_k - 1, block_k, rounding_mode="floor").float().mean()
        forward = forward / cdiv(geometry.in_channels, block_k)
    return torch.stack([forward, wgrad])
