"""Stage-2 Triton kernels of the spike-sparse convolution's weight gradients, and their launchers.

  `_sparse_conv_wgrad_kernel`, `_sparse_depthwise_wgrad_kernel`: split reductions over (sample,
  8x8 tile) without atomics, silent inputs skipped. Grids depend on shapes only (graph-capturable);
  run-time loop bounds are `while` loops (Triton 3.6's interpreter fails on range() there).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.sparse_conv.geometry import ConvGeometry, cdiv, next_pow2
from kernels.sparse_conv.triton import CONV_ARGS, DEFAULT_CONFIG, KernelConfig, conv_args, dot_dtype

_MAX_WGRAD_PARTIAL_BYTES = 8 << 20  # bound on the split reduction's scratch buffer


@triton.jit(do_not_specialize=CONV_ARGS)
def _sparse_conv_wgrad_kernel(
    x_ptr, g_ptr, active_ptr, partial_ptr,
    in_channels, out_channels, height, width, out_h, out_w, tiles, tiles_w, pairs,
    sx_n, sx_c, sx_h, sx_w, sg_n, sg_c, sg_h, sg_w,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    CHUNK_C: tl.constexpr, TAPS_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    # One program: a chunk of CHUNK_C input channels x all taps (rows) by BLOCK_N output
    # channels, summed over its share of the (sample, tile) pairs; pairs where none of its
    # channels is active are skipped, silent channels are not read.
    co_blocks = tl.cdiv(out_channels, BLOCK_N)
    c0 = (tl.program_id(0) // co_blocks) * CHUNK_C
    offs_co = (tl.program_id(0) % co_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    co_ok = offs_co < out_channels
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    offs_r = tl.arange(0, TAPS_PAD * CHUNK_C)
    tap = offs_r // CHUNK_C
    ci = c0 + offs_r % CHUNK_C
    r_ok = (tap < KH * KW) & (ci < in_channels)
    kh = tap // KW
    kw = tap % KW
    offs_m = tl.arange(0, TILE_H * TILE_W)
    acc = tl.zeros((TAPS_PAD * CHUNK_C, BLOCK_N), tl.float32)
    pair = split
    while pair < pairs:
        r_active = r_ok & (tl.load(active_ptr + pair * in_channels + ci, mask=r_ok, other=0) != 0)
        if tl.max(r_active.to(tl.int32), axis=0) > 0:
            n = pair // tiles
            tile = pair % tiles
            oh = (tile // tiles_w) * TILE_H + offs_m // TILE_W
            ow = (tile % tiles_w) * TILE_W + offs_m % TILE_W
            pix_ok = (oh < out_h) & (ow < out_w)
            g_ptrs = g_ptr + n.to(tl.int64) * sg_n + offs_co[None, :] * sg_c + oh[:, None] * sg_h + ow[:, None] * sg_w
            g = tl.load(g_ptrs, mask=pix_ok[:, None] & co_ok[None, :], other=0.0)
            ih = oh[:, None] * stride_h - pad_h + kh[None, :] * dil_h
            iw = ow[:, None] * stride_w - pad_w + kw[None, :] * dil_w
            a_ok = pix_ok[:, None] & r_active[None, :] & (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)
            a_ptrs = x_ptr + n.to(tl.int64) * sx_n + ci[None, :] * sx_c + ih * sx_h + iw * sx_w
            a = tl.load(a_ptrs, mask=a_ok, other=0.0)
            acc = tl.dot(tl.trans(a).to(DOT_DTYPE), g.to(DOT_DTYPE), acc, input_precision="tf32")
        pair += splits
    out = partial_ptr + ((split * KH * KW + tap[:, None]) * in_channels + ci[:, None]) * out_channels + offs_co[None, :]
    tl.store(out, acc, mask=r_ok[:, None] & co_ok[None, :])


@triton.jit(do_not_specialize=CONV_ARGS)
def _sparse_depthwise_wgrad_kernel(
    x_ptr, g_ptr, active_ptr, partial_ptr,
    channels, height, width, out_h, out_w, tiles, tiles_w, pairs,
    sx_n, sx_c, sx_h, sx_w, sg_n, sg_c, sg_h, sg_w,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    TAPS_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
):
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < channels
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    taps = tl.arange(0, TAPS_PAD)
    offs_m = tl.arange(0, TILE_H * TILE_W)
    acc = tl.zeros((TAPS_PAD, BLOCK_C), tl.float32)
    pair = split
    while pair < pairs:
        c_active = tl.load(active_ptr + pair * channels + offs_c, mask=c_ok, other=0) != 0
        if tl.max(c_active.to(tl.int32), axis=0) > 0:
            n = pair // tiles
            tile = pair % tiles
            oh = (tile // tiles_w) * TILE_H + offs_m // TILE_W
            ow = (tile % tiles_w) * TILE_W + offs_m % TILE_W
            pix_ok = (oh < out_h) & (ow < out_w)
            g_ptrs = g_ptr + n.to(tl.int64) * sg_n + offs_c[None, :] * sg_c + oh[:, None] * sg_h + ow[:, None] * sg_w
            g = tl.load(g_ptrs, mask=pix_ok[:, None] & c_active[None, :], other=0.0).to(tl.float32)
            x_base = x_ptr + n.to(tl.int64) * sx_n + offs_c[None, :] * sx_c
            for kh in tl.static_range(KH):
                ih = oh * stride_h - pad_h + kh * dil_h
                row_ok = pix_ok & (ih >= 0) & (ih < height)
                for kw in tl.static_range(KW):
                    iw = ow * stride_w - pad_w + kw * dil_w
                    ok = (row_ok & (iw >= 0) & (iw < width))[:, None] & c_active[None, :]
                    xv = tl.load(x_base + ih[:, None] * sx_h + iw[:, None] * sx_w, mask=ok, other=0.0)
                    tap_sum = tl.sum(g * xv.to(tl.float32), axis=0)
                    acc += tl.where(taps[:, None] == kh * KW + kw, tap_sum[None, :], 0.0)
        pair += splits
    out = partial_ptr + (split * KH * KW + taps[:, None]) * channels + offs_c[None, :]
    tl.store(out, acc, mask=(taps < KH * KW)[:, None] & c_ok[None, :])


def wgrad_chunk(geometry: ConvGeometry, config: KernelConfig) -> int:
    """Input channels per weight-gradient program: rows = (padded taps) x channels."""
    return max(1, config.wgrad_rows // next_pow2(geometry.taps))


def _split_count(x: torch.Tensor, programs: int, pairs: int, partial_bytes_per_split: int) -> int:
    """How many ways the (sample, tile) reduction is split: enough programs to fill the GPU,
    within the scratch-buffer bound."""
    target = 4 * torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
    by_memory = max(1, _MAX_WGRAD_PARTIAL_BYTES // partial_bytes_per_split)
    return max(1, min(cdiv(target, programs), pairs, by_memory))


def sparse_conv_wgrad(
    x: torch.Tensor, grad_y: torch.Tensor, geometry: ConvGeometry, active: torch.Tensor,
    weight_dtype: torch.dtype, config: KernelConfig = DEFAULT_CONFIG,
) -> torch.Tensor:
    """dL/dW [C_out, C_in, KH, KW] for dense weights, from the active (sample, tile, channel)s."""
    rows, cols = geometry.rows, geometry.cols
    taps, c_in, c_out = geometry.taps, geometry.in_channels, geometry.out_channels
    chunk = wgrad_chunk(geometry, config)
    block_n = min(config.wgrad_block_n, max(16, next_pow2(c_out)))
    programs = cdiv(c_in, chunk) * cdiv(c_out, block_n)
    pairs = geometry.batch * geometry.tiles
    splits = _split_count(x, programs, pairs, taps * c_in * c_out * 4)
    partial = torch.empty((splits, taps, c_in, c_out), device=x.device, dtype=torch.float32)
    _sparse_conv_wgrad_kernel[(programs, splits)](
        x, grad_y, active, partial,
        c_in, c_out, rows.size, cols.size, rows.out_size, cols.out_size, geometry.tiles, cols.tiles, pairs,
        *x.stride(), *grad_y.stride(), *conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        CHUNK_C=chunk, TAPS_PAD=next_pow2(taps), BLOCK_N=block_n,
        DOT_DTYPE=dot_dtype(x.dtype),
        num_warps=config.wgrad_num_warps,
    )
    grad_w = partial.sum(dim=0).view(rows.kernel, cols.kernel, c_in, c_out).permute(3, 2, 0, 1)
    return grad_w.to(weight_dtype).contiguous()


def sparse_depthwise_wgrad(
    x: torch.Tensor, grad_y: torch.Tensor, geometry: ConvGeometry, active: torch.Tensor,
    weight_dtype: torch.dtype, config: KernelConfig = DEFAULT_CONFIG,
) -> torch.Tensor:
    """dL/dW [C, 1, KH, KW] for depthwise weights, reading only active (sample, tile, channel)s."""
    rows, cols = geometry.rows, geometry.cols
    taps, channels = geometry.taps, geometry.in_channels
    block_c = min(config.depthwise_wgrad_block_c, next_pow2(channels))
    programs = cdiv(channels, block_c)
    pairs = geometry.batch * geometry.tiles
    splits = _split_count(x, programs, pairs, taps * channels * 4)
    partial = torch.empty((splits, taps, channels), device=x.device, dtype=torch.float32)
    _sparse_depthwise_wgrad_kernel[(programs, splits)](
        x, grad_y, active, partial,
        channels, rows.size, cols.size, rows.out_size, cols.out_size, geometry.tiles, cols.tiles, pairs,
        *x.stride(), *grad_y.stride(), *conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        TAPS_PAD=next_pow2(taps), BLOCK_C=block_c, num_warps=config.depthwise_num_warps,
    )
    grad_w = partial.sum(dim=0).view(rows.kernel, cols.kernel, channels).permute(2, 0, 1).unsqueeze(1)
    return grad_w.to(weight_dtype).contiguous()
