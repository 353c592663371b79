"""The Triton ST-BIF's autograd: torch.library custom ops for torch.compile, an autograd.Function in eager.

custom_op + register_fake + register_autograd (not triton_op/wrap_triton, which refuses kernels
under TRITON_INTERPRET=1): torch.compile(fullgraph=True) traces the forward and the backward op
without a graph break. Eager calls go through `STBIFFunction` instead, which takes the input's
Plan (triton.py) and calls the launchers without the custom op's dispatch and generated autograd:
a spiking supernet's step is host-bound. Saved for backward: x_seq and the threshold only.
"""
import torch
from torch import Tensor

from kernels.block_map import BlockMap

from .plan import Plan, backward, forward, get_plan, st_bif_bwd, st_bif_fwd


@torch.library.custom_op("aso_se::st_bif_forward", mutates_args=())
def _st_bif_forward_op(
    x_seq: Tensor, q_threshold: Tensor, pos_max: int, neg_min: int, surrogate: str
) -> Tensor:
    # `surrogate` is unused here but must be an input so that the backward sees it.
    return st_bif_fwd(x_seq, q_threshold, pos_max, neg_min)[0]


@_st_bif_forward_op.register_fake
def _(x_seq: Tensor, q_threshold: Tensor, pos_max: int, neg_min: int, surrogate: str) -> Tensor:
    return torch.empty_like(x_seq, memory_format=torch.contiguous_format)


@torch.library.custom_op("aso_se::st_bif_backward", mutates_args=())
def _st_bif_backward_op(
    grad_out: Tensor,
    x_seq: Tensor,
    q_threshold: Tensor,
    pos_max: int,
    neg_min: int,
    surrogate: str,
    grad_threshold: bool,
) -> tuple[Tensor, Tensor]:
    return st_bif_bwd(grad_out, x_seq, q_threshold, pos_max, neg_min, surrogate, grad_threshold)


@_st_bif_backward_op.register_fake
def _(
    grad_out: Tensor,
    x_seq: Tensor,
    q_threshold: Tensor,
    pos_max: int,
    neg_min: int,
    surrogate: str,
    grad_threshold: bool,
) -> tuple[Tensor, Tensor]:
    grad_x = torch.empty_like(x_seq, memory_format=torch.contiguous_format)
    return grad_x, torch.empty_like(q_threshold) if grad_threshold else x_seq.new_empty(0, dtype=torch.float32)


def _setup_context(ctx, inputs: tuple, output: Tensor) -> None:
    x_seq, q_threshold, pos_max, neg_min, surrogate = inputs
    ctx.save_for_backward(x_seq, q_threshold)
    ctx.bounds = (pos_max, neg_min)
    ctx.surrogate = surrogate


def _backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor | None, None, None, None]:
    x_seq, q_threshold = ctx.saved_tensors
    grad_threshold = ctx.needs_input_grad[1]
    grad_x, grad_theta = _st_bif_backward_op(
        grad_out, x_seq, q_threshold, *ctx.bounds, ctx.surrogate, grad_threshold
    )
    return grad_x, grad_theta if grad_threshold else None, None, None, None


_st_bif_forward_op.register_autograd(_backward, setup_context=_setup_context)


class STBIFFunction(torch.autograd.Function):
    """The eager path: the custom ops' forward and backward on an input's Plan (made, with the
    input checked, by the caller)."""

    @staticmethod
    def forward(ctx, x_seq: Tensor, q_threshold: Tensor, plan: Plan, block_map: BlockMap | None = None) -> Tensor:
        # block_map: filled in place by the kernel (see st_bif_fwd); not part of the autograd graph.
        ctx.save_for_backward(x_seq, q_threshold)
        ctx.plan = plan
        return forward(plan, x_seq, q_threshold, False, block_map)[0]

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor | None, None, None]:
        x_seq, q_threshold = ctx.saved_tensors
        grad_threshold = ctx.needs_input_grad[1]
        grad_x, grad_theta = backward(ctx.plan, grad_out, x_seq, q_threshold, grad_threshold)
        return grad_x, grad_theta, None, None


def st_bif_triton(
    x_seq: Tensor, q_threshold: Tensor, pos_max: int, neg_min: int, surrogate: str,
    block_map: BlockMap | None = None,
) -> Tensor:
    """ST-BIF forward on the Triton kernels, differentiable in x_seq and q_threshold; fills
    `block_map` if given (eager only: under torch.compile it must be None)."""
    if torch.compiler.is_compiling():
        if block_map is not None:
            raise ValueError("st_bif: a block map is not written under torch.compile; pass block_map=None")
        return _st_bif_forward_op(x_seq, q_threshold, pos_max, neg_min, surrogate)
    plan = get_plan(x_seq, pos_max, neg_min, surrogate)
    if block_map is not None and plan.map_dims is None:
        raise ValueError(f"a block map needs a [T, B, C, H, W] sequence of fewer than 2**31 neurons per step, "
                         f"got shape {tuple(x_seq.shape)}")
    return STBIFFunction.apply(x_seq, q_threshold, plan, block_map)
