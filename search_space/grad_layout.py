"""An identity whose gradient is handed back in the memory format of its input.

A cell's output concatenates its nodes along channels, so in the backward every node gets a channel
slice of the output's gradient: strided in any layout. Summed with the gradients of the node's other
readers it comes out NCHW even when the network runs channels_last, and PyTorch's batch norm and convs
then leave their channels_last kernels (the generic batch-norm backward reduction was the largest kernel of
the full-size retrain's step). One copy per state in the right layout costs less than those fallbacks.
"""
from __future__ import annotations

import torch
from torch import Tensor


class _GradInInputLayout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.memory_format = (torch.channels_last if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
                             else torch.contiguous_format)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.contiguous(memory_format=ctx.memory_format)


def grad_in_input_layout(x: Tensor) -> Tensor:
    """``x`` itself in the forward; its gradient made contiguous in ``x``'s layout (channels_last or NCHW)."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return x
    return _GradInInputLayout.apply(x)
