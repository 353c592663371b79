"""The ST-BIF neuron with graded spikes: up to ``spikes_per_step`` spikes of either sign in one step.

Per neuron, with threshold θ, integer bounds neg_min < pos_max and m = ``spikes_per_step``,
from q_0 = 0.5, acc_0 = 0:
    u_t   = q_{t-1} + x_t / θ
    s_t   = clip(floor(u_t), max(−m, neg_min − acc_{t-1}), min(m, pos_max − acc_{t-1}))
    acc_t = acc_{t-1} + s_t ;  q_t = u_t − s_t ;  out_t = s_t·θ
m = 1 is ST-BIF itself (kernels/st_bif/reference.py): s = +1 for u ≥ 1, −1 for u < 0, within the
bounds. The invariant q_t = 0.5 + Σx/θ − acc_t is the same for every m, so a neuron that falls silent
has emitted the QANN's θ·clip(floor(Σx/θ + 0.5)): the conversion stays exact, and a larger m lets a
neuron emit its count in fewer steps. A step's output is then a small signed integer times θ, not a
binary spike: energy.py counts the convs that read it as MACs. Inference only (the SNN is converted
from a trained QANN, never trained itself), a torch loop over T.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


def graded_st_bif(x_seq: Tensor, q_threshold: Tensor, pos_max: int, neg_min: int,
                  spikes_per_step: int) -> Tensor:
    """Runs the graded neuron over ``x_seq`` ``[T, ...]`` from its initial state; returns ``out`` ``[T, ...]``."""
    state_dtype = torch.promote_types(x_seq.dtype, torch.float32)
    theta = q_threshold.to(state_dtype)
    q = torch.full(x_seq.shape[1:], 0.5, dtype=state_dtype, device=x_seq.device)
    acc = torch.zeros_like(q)
    out = []
    for x_t in x_seq:
        u = q + x_t.to(state_dtype) / theta
        low = torch.clamp(neg_min - acc, min=-spikes_per_step)
        high = torch.clamp(pos_max - acc, max=spikes_per_step)
        s = torch.minimum(torch.maximum(torch.floor(u), low), high)
        acc = acc + s
        q = u - s
        out.append((s * theta).to(x_seq.dtype))
    return torch.stack(out)


class GradedSTBIF(nn.Module):
    """Multi-step ST-BIF with graded spikes for ``[T, B, ...]`` input; see the module docstring."""

    def __init__(self, q_threshold: Tensor, pos_max: int, neg_min: int, spikes_per_step: int) -> None:
        super().__init__()
        if isinstance(spikes_per_step, bool) or not isinstance(spikes_per_step, int) or spikes_per_step < 1:
            raise ValueError(f"spikes_per_step={spikes_per_step!r}: expected an int >= 1 (1: binary ST-BIF)")
        self.register_buffer("q_threshold", q_threshold.detach().clone())
        self.pos_max, self.neg_min, self.spikes_per_step = pos_max, neg_min, spikes_per_step

    def forward(self, x_seq: Tensor) -> Tensor:
        return graded_st_bif(x_seq, self.q_threshold, self.pos_max, self.neg_min, self.spikes_per_step)

    def extra_repr(self) -> str:
        return f"pos_max={self.pos_max}, neg_min={self.neg_min}, spikes_per_step={self.spikes_per_step}"
