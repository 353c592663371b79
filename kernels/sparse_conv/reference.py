"""Readable torch reference of the two-stage spike-sparse convolution.

Stage 1 marks which input blocks (sample, channel, BLOCK x BLOCK pixels) hold any non-zero and,
from that, which input channels are active in each (sample, output tile)'s input window. Stage 2
computes each output tile from its active channels only: a channel that is zero over a tile's
window adds exactly zero there, so the result equals F.conv2d for any input. grad_input is dense
(a silent input still gets a gradient) and comes from torch; the weight gradient sums over the
active (sample, tile, channel)s only. The Triton path follows the same stages with its own tiles.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input, conv2d_weight

from kernels.sparse_conv.geometry import BLOCK, ConvGeometry


def block_activity(x: torch.Tensor) -> torch.Tensor:
    """bool [N, C, ceil(H/BLOCK), ceil(W/BLOCK)]: does the block hold any non-zero?"""
    batch, channels, height, width = x.shape
    padded = F.pad(x, (0, -width % BLOCK, 0, -height % BLOCK))
    blocks = padded.ne(0).reshape(batch, channels, padded.shape[2] // BLOCK, BLOCK, -1, BLOCK)
    return blocks.any(dim=5).any(dim=3)


def tile_activity(blocks: torch.Tensor, geometry: ConvGeometry) -> torch.Tensor:
    """bool [N, tiles, C]: is the channel non-zero anywhere in the output tile's input window?"""
    per_tile = []
    for tile_row in range(geometry.rows.tiles):
        row_blocks = geometry.rows.block_range(tile_row)
        for tile_col in range(geometry.cols.tiles):
            col_blocks = geometry.cols.block_range(tile_col)
            window = blocks[:, :, row_blocks.start:row_blocks.stop, col_blocks.start:col_blocks.stop]
            per_tile.append(window.flatten(2).any(dim=2))
    return torch.stack(per_tile, dim=1)


def _active_windows(x: torch.Tensor, geometry: ConvGeometry):
    """Yields (sample, active channels, output rows, output cols, input window of those channels)
    for every (sample, output tile) with any active channel."""
    rows, cols = geometry.rows, geometry.cols
    active = tile_activity(block_activity(x), geometry)
    padded = F.pad(x, (cols.padding, cols.padding, rows.padding, rows.padding))
    for sample in range(geometry.batch):
        for tile in range(geometry.tiles):
            channels = active[sample, tile].nonzero().flatten()
            if channels.numel() == 0:
                continue  # every input the tile reads is zero
            tile_r, tile_c = divmod(tile, cols.tiles)
            out_r = slice(tile_r * rows.tile, min((tile_r + 1) * rows.tile, rows.out_size))
            out_c = slice(tile_c * cols.tile, min((tile_c + 1) * cols.tile, cols.out_size))
            window = padded[
                sample : sample + 1, channels,
                out_r.start * rows.stride : (out_r.stop - 1) * rows.stride + (rows.kernel - 1) * rows.dilation + 1,
                out_c.start * cols.stride : (out_c.stop - 1) * cols.stride + (cols.kernel - 1) * cols.dilation + 1,
            ]
            yield sample, channels, out_r, out_c, window


def sparse_conv2d_forward_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry: ConvGeometry
) -> torch.Tensor:
    """F.conv2d for groups 1 or depthwise, computed tile by tile from the active channels only."""
    conv = dict(stride=(geometry.rows.stride, geometry.cols.stride),
                dilation=(geometry.rows.dilation, geometry.cols.dilation))
    y = x.new_zeros(geometry.output_shape)
    if bias is not None:
        y += bias.view(1, -1, 1, 1)
    for sample, channels, out_r, out_c, window in _active_windows(x, geometry):
        if geometry.is_depthwise:
            y[sample, channels, out_r, out_c] += F.conv2d(window, weight[channels], groups=channels.numel(), **conv)[0]
        else:
            y[sample, :, out_r, out_c] += F.conv2d(window, weight[:, channels], **conv)[0]
    return y


def sparse_conv2d_weight_grad_reference(
    x: torch.Tensor, grad_y: torch.Tensor, weight_shape: torch.Size, geometry: ConvGeometry
) -> torch.Tensor:
    """dL/dW summed over the active (sample, tile, channel)s only: silent inputs add nothing."""
    conv = dict(stride=(geometry.rows.stride, geometry.cols.stride),
                dilation=(geometry.rows.dilation, geometry.cols.dilation))
    grad_w = x.new_zeros(weight_shape, dtype=torch.float32)
    for sample, channels, out_r, out_c, window in _active_windows(x.float(), geometry):
        if geometry.is_depthwise:
            grad_tile = grad_y[sample : sample + 1, channels, out_r, out_c].float()
            grad_w[channels] += conv2d_weight(window, (channels.numel(), *weight_shape[1:]), grad_tile,
                                              groups=channels.numel(), **conv)
        else:
            grad_tile = grad_y[sample : sample + 1, :, out_r, out_c].float()
            grad_w[:, channels] += conv2d_weight(window, (weight_shape[0], channels.numel(), *weight_shape[2:]),
                                                 grad_tile, **conv)
    return grad_w.to(x.dtype)


class SparseConv2dReference(torch.autograd.Function):
    """Autograd of the two-stage algorithm. grad_input is dense (a silent input still receives a
    gradient), so it comes from torch; the weight gradient skips silent inputs, like the
    Triton kernel."""

    @staticmethod
    def forward(ctx, x, weight, bias, geometry: ConvGeometry):
        ctx.save_for_backward(x, weight)
        ctx.geometry = geometry
        ctx.has_bias = bias is not None
        return sparse_conv2d_forward_reference(x, weight, bias, geometry)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        geometry = ctx.geometry
        conv = dict(stride=(geometry.rows.stride, geometry.cols.stride),
                    padding=(geometry.rows.padding, geometry.cols.padding),
                    dilation=(geometry.rows.dilation, geometry.cols.dilation), groups=geometry.groups)
        grad_x = conv2d_input(x.shape, weight, grad_y, **conv) if ctx.needs_input_grad[0] else None
        grad_w = (sparse_conv2d_weight_grad_reference(x, grad_y, weight.shape, geometry)
                  if ctx.needs_input_grad[1] else None)
        grad_b = grad_y.sum(dim=(0, 2, 3)) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b, None


def sparse_conv2d_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry: ConvGeometry
) -> torch.Tensor:
    """The two-stage algorithm in torch, differentiable; equals F.conv2d for any input."""
    return SparseConv2dReference.apply(x, weight, bias, geometry)
