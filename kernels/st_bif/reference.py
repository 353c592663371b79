"""Readable torch reference of the multi-step ST-BIF neuron: the ground truth.

Per neuron, with threshold θ > 0 and integer bounds neg_min < pos_max, from q_0 = 0.5, acc_0 = 0:
    u_t   = q_{t-1} + x_t / θ
    s_t   = [u_t >= 1]·[acc_{t-1} < pos_max] − [u_t < 0]·[acc_{t-1} > neg_min]
    acc_t = acc_{t-1} + s_t ;  q_t = u_t − s_t ;  out_t = s_t·θ
States are fp32 for fp16/bf16/fp32 inputs (fp64 stays fp64, for gradcheck); out has the input
dtype. Autograd runs BPTT through u with a surrogate in place of the spike's derivative; the
counter acc is not differentiated (its bounds act as gates).
"""
from typing import Callable

import torch
from torch import Tensor

from .surrogates import Surrogate

# fire(u, can_fire_pos, can_fire_neg) -> s: the spike rule; the gates are 0/1 masks.
SpikeRule = Callable[[Tensor, Tensor, Tensor], Tensor]


class SurrogateSpike(torch.autograd.Function):
    """s = [u >= 1]·can_pos − [u < 0]·can_neg; its backward uses
    ds/du = σ′(u−1)·can_pos + σ′(−u)·can_neg in place of the steps' Dirac deltas."""

    @staticmethod
    def forward(ctx, u: Tensor, can_pos: Tensor, can_neg: Tensor, surrogate: Surrogate) -> Tensor:
        ctx.save_for_backward(u, can_pos, can_neg)
        ctx.surrogate = surrogate
        return (u >= 1).to(u.dtype) * can_pos - (u < 0).to(u.dtype) * can_neg

    @staticmethod
    def backward(ctx, grad_s: Tensor) -> tuple[Tensor, None, None, None]:
        u, can_pos, can_neg = ctx.saved_tensors
        derivative, alpha = ctx.surrogate.derivative, ctx.surrogate.alpha
        ds_du = derivative(u - 1, alpha) * can_pos + derivative(-u, alpha) * can_neg
        return grad_s * ds_du, None, None, None


def st_bif_loop(
    x_seq: Tensor, q_threshold: Tensor, pos_max: int, neg_min: int, fire: SpikeRule
) -> tuple[Tensor, Tensor, Tensor]:
    """Runs the neuron over x_seq [T, ...] with spike rule `fire`; returns (out, q_T, acc_T)."""
    state_dtype = torch.promote_types(x_seq.dtype, torch.float32)
    theta = q_threshold.to(state_dtype)
    q = torch.full(x_seq.shape[1:], 0.5, dtype=state_dtype, device=x_seq.device)
    acc = torch.zeros_like(q)
    out = []
    for x_t in x_seq:
        u = q + x_t.to(state_dtype) / theta
        s = fire(u, (acc < pos_max).to(state_dtype), (acc > neg_min).to(state_dtype))
        acc = acc + s.detach()
        q = u - s
        out.append((s * theta).to(x_seq.dtype))
    return torch.stack(out), q, acc


def st_bif_reference(
    x_seq: Tensor, q_threshold: Tensor, pos_max: int, neg_min: int, surrogate: Surrogate
) -> tuple[Tensor, Tensor, Tensor]:
    """The ST-BIF neuron with surrogate gradients; returns (out, q_T, acc_T)."""

    def fire(u: Tensor, can_pos: Tensor, can_neg: Tensor) -> Tensor:
        return SurrogateSpike.apply(u, can_pos, can_neg, surrogate)

    return st_bif_loop(x_seq, q_threshold, pos_max, neg_min, fire)
