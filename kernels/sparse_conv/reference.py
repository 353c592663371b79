"""Readable torch reference of the two-stage spike-sparse convolution.

Stage 1 marks which input blocks (sample, channel, BLOCK x BLOCK pixels) hold any non-zero, and
from that, for every (sample, output tile), which input channels are active anywhere in the
tile's input window. Stage 2 computes each output tile from its active channels only. A channel
that is all-zero over a tile's window contributes exactly zero to that tile, so the result equals
F.conv2d for any input; only the work depends on the sparsity. The Triton path mirrors this.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

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


def sparse_conv2d_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    geometry: ConvGeometry,
) -> torch.Tensor:
    """F.conv2d(x, weight, bias, ...) for groups 1 or depthwise, computed tile by tile from the
    active channels only."""
    rows, cols = geometry.rows, geometry.cols
    active = tile_activity(block_activity(x), geometry)
    padded = F.pad(x, (cols.padding, cols.padding, rows.padding, rows.padding))
    y = x.new_zeros(geometry.output_shape)
    if bias is not None:
        y = y + bias.view(1, -1, 1, 1)
    for sample in range(geometry.batch):
        for tile in range(geometry.tiles):
            channels = active[sample, tile].nonzero().flatten()
            if channels.numel() == 0:
                continue  # every input the tile reads is zero: output stays at the bias
            out_r = slice(tile // cols.tiles * rows.tile, min((tile // cols.tiles + 1) * rows.tile, rows.out_size))
            out_c = slice(tile % cols.tiles * cols.tile, min((tile % cols.tiles + 1) * cols.tile, cols.out_size))
            window = padded[
                sample : sample + 1, channels,
                out_r.start * rows.stride : (out_r.stop - 1) * rows.stride + (rows.kernel - 1) * rows.dilation + 1,
                out_c.start * cols.stride : (out_c.stop - 1) * cols.stride + (cols.kernel - 1) * cols.dilation + 1,
            ]
            conv = dict(stride=(rows.stride, cols.stride), dilation=(rows.dilation, cols.dilation))
            if geometry.is_depthwise:
                out = F.conv2d(window, weight[channels], groups=channels.numel(), **conv)
                y[sample, channels, out_r, out_c] = y[sample, channels, out_r, out_c] + out[0]
            else:
                out = F.conv2d(window, weight[:, channels], **conv)
                y[sample, :, out_r, out_c] = y[sample, :, out_r, out_c] + out[0]
    return y
