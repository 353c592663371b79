"""The depthwise conv's autograd on the Triton kernels: channels_last in and out, both gradients in one pass."""
import torch
from torch import Tensor

from .triton import depthwise_bwd, depthwise_fwd


class DepthwiseConv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, stride: int, padding: int, dilation: int) -> Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        ctx.save_for_backward(x, weight)
        ctx.geometry = stride, padding, dilation
        return depthwise_fwd(x, weight, stride, padding, dilation)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None, None]:
        x, weight = ctx.saved_tensors
        grad_x, grad_w = depthwise_bwd(x, weight, grad.contiguous(memory_format=torch.channels_last), *ctx.geometry)
        return (grad_x if ctx.needs_input_grad[0] else None, grad_w if ctx.needs_input_grad[1] else None,
                None, None, None)
