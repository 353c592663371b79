"""The pools' autograd on the Triton kernels: channels_last in and out, the max pool's tap indices saved."""
import torch
from torch import Tensor

from .triton import pool_bwd, pool_fwd


class Pool3x3Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, kind: str, stride: int) -> Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        y, idx = pool_fwd(x, stride, kind == "max")
        ctx.save_for_backward(idx)
        ctx.size, ctx.stride = x.shape[2:], stride
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (idx,) = ctx.saved_tensors
        return pool_bwd(grad.contiguous(memory_format=torch.channels_last), idx, ctx.size, ctx.stride), None, None
