"""The readable reference: a DARTS node's sum of two edge outputs, each scaled per sample by its drop-path."""
from __future__ import annotations

from torch import Tensor


def scaled_per_sample(x: Tensor, scale: Tensor | None, timesteps: int) -> Tensor:
    """``x`` ([T*B, ...], time-first) times ``scale[b]`` for every element of sample b at every step."""
    if scale is None:
        return x
    per_sample = scale.view(1, -1, *([1] * (x.dim() - 1)))
    return (x.unflatten(0, (timesteps, -1)) * per_sample).flatten(0, 1)


def drop_path_sum_reference(a: Tensor, b: Tensor, scale_a: Tensor | None, scale_b: Tensor | None,
                            timesteps: int = 1) -> Tensor:
    """``a · scale_a[sample] + b · scale_b[sample]`` (a None scale: the term as it is), in fp32, rounded once to
    the terms' dtype (as the kernel does)."""
    total = scaled_per_sample(a.float(), None if scale_a is None else scale_a.float(), timesteps)
    return (total + scaled_per_sample(b.float(), None if scale_b is None else scale_b.float(), timesteps)).to(a.dtype)
