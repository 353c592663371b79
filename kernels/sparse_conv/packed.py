"""Stride-1 dense forward on packed input: each sample's active channels copied densely, then an
implicit GEMM over them (cheaper per element than gathering from x in every tap).

  `_pack_kernel`       per (sample, pixel range): ranks the sample's active channels (block map ORed
                       over the plane) and copies them to [N, C/KC, H, W, KC], slot s at chunk
                       s // KC, lane s % KC, zeros past the count; also writes the list (`index`
                       [N, C], `count` [N]) and the weight laid out [KH, KW, C_in, C_out].
  `_packed_fwd_kernel` per (output-channel block, output tile, sample): for each chunk and tap,
                       A = the chunk's shifted pixels, B = the chunk's weight rows.
Stride 1, any padding and dilation; x is read by its strides. No host sync (graph-capturable).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from kernels.dependent_launch import use_pdl, wait_then_release
from kernels.sparse_conv.geometry import ConvGeometry, cdiv, next_pow2

KC = 16  # channels per K chunk: one tl.dot's K, and the packed layout's innermost extent
WEIGHT_COPY_BLOCK = 1024  # weight elements a packing program copies per step


@triton.jit
def _chunk_channels(active, rank, offs_c, slot):
    """The channel holding each of the slots `slot` (its rank among the active ones): the
    compaction, done in registers."""
    match = (active[None, :] != 0) & (rank[None, :] == slot[:, None])
    return tl.sum(tl.where(match, offs_c[None, :], 0), axis=1)


@triton.jit
def _copy_active(src, dst, active, rank, offs_c, offs_j, count, sx_c, pix_ok, plane, KC: tl.constexpr):
    """Copies the active channels of `src`'s pixels to `dst`, KC slots per chunk."""
    k0 = 0
    while k0 < tl.maximum(count, 1):  # chunk 0 even when no channel is active: the forward reads it unconditionally
        slot = k0 + offs_j
        ci = _chunk_channels(active, rank, offs_c, slot)
        values = tl.load(src + ci[None, :] * sx_c, mask=pix_ok[:, None] & (slot < count)[None, :], other=0.0,
                         eviction_policy="evict_first")  # read once; L2 is for packed, which is read 9 times
        tl.store(dst + (k0 // KC) * plane * KC, values, mask=pix_ok[:, None])
        k0 += KC


@triton.jit
def _pack_kernel(
    x_ptr, blocks_ptr, packed_ptr, index_ptr, count_ptr, w_ptr, w_rows_ptr,
    channels, height, width, blocks_per_plane, sx_n, sx_c, sx_h, sx_w,
    out_channels, weight_numel, sw_o, sw_i, sw_h, sw_w,
    C_PAD: tl.constexpr, BLOCK_PIX: tl.constexpr, KC: tl.constexpr, BLOCK_B: tl.constexpr,
    PLANAR: tl.constexpr, KW: tl.constexpr, BLOCK_W: tl.constexpr, PDL: tl.constexpr,
):
    pix_block = tl.program_id(0)
    n = tl.program_id(1)
    wait_then_release(PDL)  # wait for x and the map, let the forward launch
    # The weight's copy laid out [KH, KW, C_in, C_out], BLOCK_W elements at a time, the programs
    # taking turns: here rather than in a copy kernel of its own, which would cost a launch per call.
    w0 = (n * tl.num_programs(0) + pix_block) * BLOCK_W
    while w0 < weight_numel:
        offs_w = w0 + tl.arange(0, BLOCK_W)
        w_co = offs_w % out_channels
        w_ci = offs_w // out_channels % channels
        w_tap = offs_w // (out_channels * channels)
        w_src = w_ptr + w_co * sw_o + w_ci * sw_i + (w_tap // KW) * sw_h + (w_tap % KW) * sw_w
        tl.store(w_rows_ptr + offs_w, tl.load(w_src, mask=offs_w < weight_numel), mask=offs_w < weight_numel)
        w0 += tl.num_programs(0) * tl.num_programs(1) * BLOCK_W
    offs_c = tl.arange(0, C_PAD)
    c_ok = offs_c < channels
    active = tl.zeros((C_PAD,), tl.int32)
    b0 = 0
    while b0 < blocks_per_plane:
        offs_b = b0 + tl.arange(0, BLOCK_B)
        flags = tl.load(blocks_ptr + (n * blocks_per_plane + offs_b[:, None]) * channels + offs_c[None, :],
                        mask=(offs_b < blocks_per_plane)[:, None] & c_ok[None, :], other=0)
        active = tl.maximum(active, tl.max(flags.to(tl.int32), axis=0))
        b0 += BLOCK_B
    rank = tl.cumsum(active, axis=0) - 1
    count = tl.sum(active, axis=0)
    if pix_block == 0:
        tl.store(index_ptr + n * channels + rank, offs_c, mask=c_ok & (active != 0))
        tl.store(count_ptr + n, count)
    plane = height * width
    pix = pix_block * BLOCK_PIX + tl.arange(0, BLOCK_PIX)
    pix_ok = pix < plane
    if PLANAR:  # each channel's plane is one contiguous run: vector loads along pixels
        pix_offset = pix
    else:
        pix_offset = (pix // width) * sx_h + (pix % width) * sx_w
    src = x_ptr + n.to(tl.int64) * sx_n + pix_offset[:, None]
    offs_j = tl.arange(0, KC)
    dst = packed_ptr + (n.to(tl.int64) * tl.cdiv(channels, KC) * plane + pix[:, None]) * KC + offs_j[None, :]
    _copy_active(src, dst, active, rank, offs_c, offs_j, count, sx_c, pix_ok, plane, KC)


@triton.jit
def _accumulate_chunk(acc, sample, k0, count, index_row, w_ptr, offs_co, co_ok, oh, ow,
                      in_channels, height, width, sw_o, sw_i, sw_h, sw_w, pad_h, pad_w, dil_h, dil_w,
                      KH: tl.constexpr, KW: tl.constexpr, KC: tl.constexpr, NUM_STAGES: tl.constexpr,
                      DOT_DTYPE: tl.constexpr):
    """acc + the implicit GEMM of the packed chunk holding slots k0..k0+KC-1 of a sample."""
    offs_k = tl.arange(0, KC)
    slot = k0 + offs_k
    k_ok = slot < count
    # The list is read up to in_channels, not count, so that this load does not wait for count.
    ci = tl.where(k_ok, tl.load(index_row + slot, mask=slot < in_channels, other=0), 0)
    w_rows = w_ptr + ci[:, None] * sw_i + offs_co[None, :] * sw_o
    chunk = sample + (k0 // KC) * (height * width * KC)
    for tap in tl.range(0, KH * KW, num_stages=NUM_STAGES):
        ih = oh - pad_h + (tap // KW) * dil_h
        iw = ow - pad_w + (tap % KW) * dil_w
        inside = (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)
        a = tl.load(chunk + (ih * width + iw)[:, None] * KC + offs_k[None, :], mask=inside[:, None], other=0.0)
        b = tl.load(w_rows + (tap // KW) * sw_h + (tap % KW) * sw_w, mask=k_ok[:, None] & co_ok[None, :], other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc, input_precision="tf32")
    return acc


@triton.jit(do_not_specialize=["pad_h", "pad_w", "dil_h", "dil_w"])
def _packed_fwd_kernel(
    packed_ptr, w_ptr, bias_ptr, y_ptr, index_ptr, count_ptr,
    in_channels, height, width, out_channels, out_h, out_w, tiles_w,
    sy_n, sy_c, sy_h, sy_w, sw_o, sw_i, sw_h, sw_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, KC: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr,
    PDL: tl.constexpr,
):
    co_block = tl.program_id(0)
    tile = tl.program_id(1)
    n = tl.program_id(2)
    PIXELS: tl.constexpr = TILE_H * TILE_W
    offs_p = tl.arange(0, PIXELS)
    oh = (tile // tiles_w) * TILE_H + offs_p // TILE_W
    ow = (tile % tiles_w) * TILE_W + offs_p % TILE_W
    offs_co = co_block * BLOCK_N + tl.arange(0, BLOCK_N)
    co_ok = offs_co < out_channels
    if PDL:  # launched while the packing ends: wait for its writes before the first load
        gdc_wait()
    count = tl.load(count_ptr + n)
    sample = packed_ptr + n.to(tl.int64) * tl.cdiv(in_channels, KC) * (height * width * KC)
    index_row = index_ptr + n * in_channels
    acc = tl.zeros((PIXELS, BLOCK_N), tl.float32)
    # Chunk 0 always exists (the packing writes zeros where a sample has no active channel), so
    # its loads need not wait for `count`: only its B is masked by it.
    acc = _accumulate_chunk(acc, sample, 0, count, index_row, w_ptr, offs_co, co_ok, oh, ow, in_channels, height, width,
                            sw_o, sw_i, sw_h, sw_w, pad_h, pad_w, dil_h, dil_w, KH, KW, KC, NUM_STAGES, DOT_DTYPE)
    k0 = KC
    while k0 < count:
        acc = _accumulate_chunk(acc, sample, k0, count, index_row, w_ptr, offs_co, co_ok, oh, ow, in_channels, height,
                                width, sw_o, sw_i, sw_h, sw_w, pad_h, pad_w, dil_h, dil_w, KH, KW, KC, NUM_STAGES,
                                DOT_DTYPE)
        k0 += KC
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_co, mask=co_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + n.to(tl.int64) * sy_n + offs_co[None, :] * sy_c + (oh * sy_h + ow * sy_w)[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=((oh < out_h) & (ow < out_w))[:, None] & co_ok[None, :],
             eviction_policy="evict_first")  # written once: L2 keeps packed and the weight


def packed_forward_available(geometry: ConvGeometry) -> bool:
    """True where this forward applies: stride 1 and dense weights."""
    return geometry.groups == 1 and geometry.rows.stride == 1 and geometry.cols.stride == 1


def pack_active_channels(
    x: torch.Tensor, blocks: torch.Tensor, weight: torch.Tensor, block_pixels: int, num_warps: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed [N, C/KC, H, W, KC], index int32 [N, C], count int32 [N], weight_rows) of x with
    block map `blocks`: each sample's active channels, in ascending order, KC per chunk,
    zero-filled; and `weight` [C_out, C_in, KH, KW] laid out [KH, KW, C_in, C_out] in memory
    (viewed with weight's shape), the forward's B operand."""
    batch, channels, height, width = x.shape
    plane = height * width
    packed = torch.empty((batch, cdiv(channels, KC), height, width, KC), device=x.device, dtype=x.dtype)
    index = torch.empty((batch, channels), device=x.device, dtype=torch.int32)
    count = torch.empty((batch,), device=x.device, dtype=torch.int32)
    out_channels, _, kernel_h, kernel_w = weight.shape
    weight_rows = torch.empty((kernel_h, kernel_w, channels, out_channels), device=x.device, dtype=weight.dtype)
    blocks_per_plane = blocks.shape[1] * blocks.shape[2]
    block_pixels = min(block_pixels, next_pow2(plane))
    grid = (cdiv(plane, block_pixels), batch)
    pdl = use_pdl(x)
    _pack_kernel[grid](
        x, blocks, packed, index, count, weight, weight_rows,
        channels, height, width, blocks_per_plane, *x.stride(),
        out_channels, weight.numel(), *weight.stride(),
        C_PAD=next_pow2(channels), BLOCK_PIX=block_pixels, KC=KC, BLOCK_B=min(16, next_pow2(blocks_per_plane)),
        PLANAR=x.stride(3) == 1 and x.stride(2) == width, KW=kernel_w,
        BLOCK_W=min(WEIGHT_COPY_BLOCK, next_pow2(cdiv(weight.numel(), grid[0] * grid[1]))), PDL=pdl,
        num_warps=num_warps, launch_pdl=pdl,
    )
    return packed, index, count, weight_rows.permute(3, 2, 0, 1)


def packed_conv_fwd(
    packed: torch.Tensor, index: torch.Tensor, count: torch.Tensor, weight: torch.Tensor,
    bias: torch.Tensor | None, y: torch.Tensor, geometry: ConvGeometry, *,
    block_n: int, num_stages: int, num_warps: int, dot_dtype: tl.dtype,
) -> torch.Tensor:
    """Writes the conv of the packed input into y; `weight` is laid out [KH, KW, C_in, C_out] in
    memory and `geometry` carries the output tiles."""
    rows, cols = geometry.rows, geometry.cols
    grid = (cdiv(geometry.out_channels, block_n), geometry.tiles, geometry.batch)
    pdl = use_pdl(y)
    _packed_fwd_kernel[grid](
        packed, weight, bias if bias is not None else weight, y, index, count,
        geometry.in_channels, rows.size, cols.size, geometry.out_channels, rows.out_size, cols.out_size, cols.tiles,
        *y.stride(), *weight.stride(), rows.padding, cols.padding, rows.dilation, cols.dilation,
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile, KC=KC,
        BLOCK_N=block_n, NUM_STAGES=num_stages, HAS_BIAS=bias is not None, DOT_DTYPE=dot_dtype,
        PDL=pdl, num_warps=num_warps, launch_pdl=pdl,
    )
    return y
