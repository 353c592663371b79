"""``st_bif_qann``: ST-BIF's quantizer trained as an ANN activation at T = 1 (a QANN).

θ·clip(floor(x/θ + 0.5), neg_min, pos_max) is what an ST-BIF neuron with threshold θ and the same
count bounds emits in total once silent; ``search_space.qann`` converts such a network to that SNN.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from kernels.st_bif import level_bounds
from search_space.errors import UserInputError
from search_space.neurons.base import register_neuron


def round_half_up(v: Tensor) -> Tensor:
    """floor(v + 0.5): ST-BIF's rounding (q0 = 0.5), which differs from torch.round at halves."""
    return torch.floor(v + 0.5)


class _Quantize(torch.autograd.Function):
    """One node for the quantizer: saves x and θ and recomputes the rest in backward (fewer kernels and
    bytes than autograd through the straight-through expression)."""

    @staticmethod
    def forward(ctx, x: Tensor, theta: Tensor, neg_min: int, pos_max: int, scale: float) -> Tensor:
        ctx.save_for_backward(x, theta)
        ctx.bounds, ctx.scale = (neg_min, pos_max), scale
        return torch.clamp(round_half_up(x / theta), neg_min, pos_max) * theta

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        x, theta = ctx.saved_tensors
        neg_min, pos_max = ctx.bounds
        v = x / theta
        inside = (v >= neg_min - 0.5) & (v < pos_max + 0.5)
        grad_x = grad * inside if ctx.needs_input_grad[0] else None
        grad_theta = None
        if ctx.needs_input_grad[1]:  # LSQ: round(v) - v inside the range, the clipped level outside
            q = torch.clamp(round_half_up(v), neg_min, pos_max)
            grad_theta = (grad * torch.where(inside, q - v, q)).sum().mul(ctx.scale).reshape(theta.shape)
        return grad_x, grad_theta, None, None, None


class QuantizedActivation(nn.Module):
    """θ·clip(floor(x/θ + 0.5), neg_min, pos_max) with a straight-through gradient for x inside the
    clip range and LSQ's gradient (scaled by 1/sqrt(features·pos_max)) for a learnable θ."""

    def __init__(
        self, q_threshold: float = 1.0, level: int = 8, sym: bool = True, learn_threshold: bool = True
    ) -> None:
        super().__init__()
        if isinstance(level, bool) or not isinstance(level, int) or level < 2:
            raise UserInputError(f"neuron st_bif_qann: level={level!r} must be an integer >= 2; fix neuron.level")
        if not q_threshold > 0:
            raise UserInputError(f"neuron st_bif_qann: q_threshold={q_threshold} must be > 0; fix neuron.q_threshold")
        self.pos_max, self.neg_min = level_bounds(level, sym)
        self.level, self.sym = level, sym
        threshold = torch.tensor(float(q_threshold))
        if learn_threshold:
            self.q_threshold = nn.Parameter(threshold)
        else:
            self.register_buffer("q_threshold", threshold)

    def forward(self, x: Tensor) -> Tensor:
        theta = self.q_threshold.to(x.dtype)
        # LSQ scales θ's gradient so that its steps match the weights'
        scale = (x[0].numel() * max(self.pos_max, 1)) ** -0.5 if theta.requires_grad else 0.0
        return _Quantize.apply(x, theta, self.neg_min, self.pos_max, scale)

    def extra_repr(self) -> str:
        learn = isinstance(self.q_threshold, nn.Parameter)
        return (f"level={self.level}, sym={self.sym}, pos_max={self.pos_max}, neg_min={self.neg_min}, "
                f"learn_threshold={learn}")


@register_neuron("st_bif_qann")
def st_bif_qann(
    timesteps: int, q_threshold: float = 0.5, level: int = 8, sym: bool = False, learn_threshold: bool = True,
) -> nn.Module:
    if timesteps != 1:
        raise UserInputError(
            f"neuron st_bif_qann trains at T = 1 (its SNN runs until silent when evaluated), "
            f"got timesteps={timesteps}; set neuron.timesteps=1"
        )
    return QuantizedActivation(q_threshold=q_threshold, level=level, sym=sym, learn_threshold=learn_threshold)
