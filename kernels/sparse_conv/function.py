"""Autograd of the sparse path, as a torch custom op (runs under Triton's interpreter on CPU and
traces under torch.compile), and the same forward without autograd for calls that need none.

Forward: block map (prescan) + the sparse Triton kernel. Backward: grad_input through cuDNN
(aten.convolution_backward; it needs no input sparsity), grad_weight from the sparse Triton
kernel when the dispatcher asked for it (`sparse_wgrad`), from cuDNN otherwise.
"""
import functools
from typing import Optional

import torch

from kernels.sparse_conv.geometry import BLOCK, ConvGeometry
from kernels.sparse_conv.prescan import block_activity, tile_activity
from kernels.sparse_conv.triton import depthwise_activity, forward_lists, sparse_conv_fwd, sparse_depthwise_fwd
from kernels.sparse_conv.wgrad import sparse_conv_wgrad, sparse_depthwise_wgrad


def conv_geometry(
    x: torch.Tensor, weight: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int], groups: int
) -> ConvGeometry:
    """The call's geometry with 8x8 output tiles: the activity tiles of the weight gradients (the
    forward kernels retile it for their own programs). Cached: it is host work on every call."""
    return _cached_geometry(tuple(x.shape), tuple(weight.shape), tuple(stride), tuple(padding), tuple(dilation), groups)


@functools.lru_cache(maxsize=4096)
def _cached_geometry(x_shape, weight_shape, stride, padding, dilation, groups) -> ConvGeometry:
    return ConvGeometry.of_shapes(x_shape, weight_shape, stride, padding, dilation, groups, tile=(BLOCK, BLOCK))


def sparse_conv2d_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
    stride: list[int], padding: list[int], dilation: list[int], groups: int,
    blocks: Optional[torch.Tensor] = None, planes: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, blocks): the convolution and its block map (int8 [N, H/8, W/8, C]): the given one
    (written by the ST-BIF kernel that made x, maybe with its plane flags [N, C]), else the
    prescan's."""
    geometry = conv_geometry(x, weight, stride, padding, dilation, groups)
    if blocks is None:
        blocks = block_activity(x)
    if geometry.is_depthwise:
        y = sparse_depthwise_fwd(x, weight, bias, *depthwise_activity(x, blocks, geometry, planes=planes))
    else:
        y = sparse_conv_fwd(x, weight, bias, forward_lists(x, blocks, geometry))
    return y, blocks


@torch.library.custom_op("aso_se::sparse_conv2d", mutates_args=())
def sparse_conv2d_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    sparse_wgrad: bool,
    blocks: Optional[torch.Tensor] = None,
    planes: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sparse_conv2d_forward` with autograd; `sparse_wgrad` picks the weight-gradient kernel."""
    y, blocks_out = sparse_conv2d_forward(x, weight, bias, stride, padding, dilation, groups, blocks, planes)
    # A custom op's outputs may not alias its inputs: a given map comes back as a copy (1/64 of x).
    return y, blocks_out.clone() if blocks_out is blocks else blocks_out


@sparse_conv2d_triton.register_fake
def _(x, weight, bias, stride, padding, dilation, groups, sparse_wgrad, blocks=None, planes=None):
    geometry = conv_geometry(x, weight, stride, padding, dilation, groups)
    y = torch.empty(geometry.output_shape, dtype=x.dtype, device=x.device)
    blocks = x.new_empty((geometry.batch, geometry.rows.blocks, geometry.cols.blocks, geometry.in_channels),
                         dtype=torch.int8)
    return y, blocks


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, stride, padding, dilation, groups, sparse_wgrad, _blocks, _planes = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.conv = (stride, padding, dilation, groups)
    ctx.sparse_wgrad = sparse_wgrad


def _backward(ctx, grad_y, _grad_blocks):
    x, weight, blocks = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.conv
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dense_wgrad = need_w and not ctx.sparse_wgrad
    grad_x = grad_w = grad_b = None
    if need_x or dense_wgrad:
        grad_x, grad_w, _ = torch.ops.aten.convolution_backward(
            grad_y, x, weight, None, stride, padding, dilation, False, [0, 0], groups,
            [need_x, dense_wgrad, False],
        )
    if need_w and ctx.sparse_wgrad:
        geometry = conv_geometry(x, weight, stride, padding, dilation, groups)
        wgrad = sparse_depthwise_wgrad if geometry.is_depthwise else sparse_conv_wgrad
        grad_w = wgrad(x, grad_y, geometry, tile_activity(blocks, geometry)[0], weight.dtype)
    if need_b:
        grad_b = grad_y.sum(dim=(0, 2, 3))
    return grad_x, grad_w, grad_b, None, None, None, None, None, None, None


sparse_conv2d_triton.register_autograd(_backward, setup_context=_setup_context)
