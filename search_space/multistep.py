"""The multi-step layout: how inputs enter it, what respects it, how logits leave it.

Inside the network every tensor is time-first and flattened, ``[T*B, C, H, W]``, so that
stateless layers run once over all steps and spiking neurons view it as ``[T, B, ...]``.
Shared by the retrain network and the supernet.
"""
from __future__ import annotations

import torch
from torch import nn

from search_space.errors import UserInputError


def mean_over_time(x: torch.Tensor, timesteps: int) -> torch.Tensor:
    """``[T*B, ...]`` → ``[B, ...]``, the average over the T steps (the readout)."""
    return x.unflatten(0, (timesteps, -1)).mean(0)


def drop_path_scale(x: torch.Tensor, drop_prob: float | torch.Tensor, timesteps: int) -> torch.Tensor:
    """DARTS's drop-path as a per-sample scale of ``x`` ([T*B, ...]): 0 with probability ``drop_prob``, else 1/keep.

    One fp32 draw per sample, shared by its T steps (with T = 1 DARTS's ``utils.drop_path``); the caller
    applies it (kernels/drop_path_sum: a node's two edges scaled and summed in one pass).
    """
    keep_prob = 1.0 - drop_prob
    mask = torch.empty(x.shape[0] // timesteps, dtype=torch.float32, device=x.device).bernoulli_(keep_prob)
    return mask / keep_prob


class Stem(nn.Sequential):
    """DARTS's stem (3x3 conv + BN), plus the time encoding of the input.

    - Static images ``[B, C, H, W]``: direct encoding, the same drive at every step. The conv+BN
      runs once on the B images and the result is repeated T times; that equals running it on T
      identical copies (same batch statistics), T times cheaper. (BN's running variance differs
      only by its unbiased-estimate factor n/(n-1), n = B·H·W instead of T·B·H·W.)
    - Event frames ``[T, B, C, H, W]`` (DVS, time-first): flattened to ``[T*B, ...]`` and run once.

    Output: ``[T*B, out_channels, H, W]``, the drive of the first neurons (the cells' preprocessing).
    A subclass of nn.Sequential so its state_dict keys are DARTS's (``stem.0.weight``, ``stem.1.*``).
    """

    def __init__(self, in_channels: int, out_channels: int, timesteps: int) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
        )
        self.timesteps = timesteps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 5:
            if x.shape[0] != self.timesteps:
                raise UserInputError(
                    f"the input has {x.shape[0]} frames per sample but the network runs T={self.timesteps} steps; "
                    "set neuron.timesteps to the data's number of frames"
                )
            return super().forward(x.flatten(0, 1))
        if x.dim() == 4:
            drive = super().forward(x)
            if drive.is_contiguous():
                return drive.repeat(self.timesteps, 1, 1, 1)
            return torch.cat([drive] * self.timesteps)  # the same values; keeps a channels_last layout
        raise ValueError(
            f"expected images [B, C, H, W] or time-first frames [T, B, C, H, W], got shape {tuple(x.shape)}"
        )

    def extra_repr(self) -> str:
        return f"timesteps={self.timesteps}"
