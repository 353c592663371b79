"""Stage 1 of the spike-sparse convolution: which input blocks hold a non-zero, and from that the
active input channels of each output tile's window. Grids depend on shapes only (no host sync,
CUDA-graph capturable).

  `_block_activity_kernel`   x -> int8 [N, H/8, W/8, C]: 1 where an 8x8 block of a plane holds a
                             non-zero (NaN counts).
  `_tile_activity_kernel`    per (sample, output tile): the flags ORed over the tile's window
                             (`window_flags`), and the active channels listed in ascending order.
  `_window_activity_kernel`  the same flags without the lists (the depthwise forward needs none).
Loops with a run-time bound are `while` loops: Triton 3.6's interpreter fails on range() there.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.dependent_launch import use_pdl, wait_then_release
from kernels.sparse_conv.geometry import BLOCK, ConvGeometry, cdiv, next_pow2

BLOCK_MAP_ELEMENTS = 8192  # x elements one block-map program loads (16 KB in fp16): the fastest on an H100 sweep
BLOCK_MAP_WARPS = 4
WINDOW_ACTIVITY_CHUNK = 128  # channels per `_window_activity_kernel` program


@triton.jit
def _block_activity_kernel(
    x_ptr, blocks_ptr,
    channels, height, width, block_rows, block_cols,
    stride_n, stride_c, stride_h, stride_w,
    BLOCK_C: tl.constexpr, BLOCK: tl.constexpr, WIDTH: tl.constexpr, PDL: tl.constexpr,
):
    wait_then_release(PDL)  # wait for x's writer, then let the next kernel launch
    # One program: 8 whole rows of BLOCK_C channels, so loads run along W in long segments;
    # samples vary slowest, so x is read front to back.
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    block_r = tl.program_id(1)
    n = tl.program_id(2)
    rows = block_r * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, WIDTH)
    c_ok = offs_c < channels
    mask = c_ok[:, None, None] & (rows < height)[None, :, None] & (cols < width)[None, None, :]
    ptrs = (x_ptr + n.to(tl.int64) * stride_n + offs_c[:, None, None] * stride_c
            + rows[None, :, None] * stride_h + cols[None, None, :] * stride_w)
    # evict_first: x streams through once here; L2 is better spent on what is read again
    nonzero = (tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first") != 0).to(tl.int32)
    per_col = tl.max(nonzero, axis=1)  # [BLOCK_C, WIDTH]
    per_block = tl.max(tl.reshape(per_col, (BLOCK_C, WIDTH // BLOCK, BLOCK)), axis=2)
    block_c = tl.arange(0, WIDTH // BLOCK)
    out = blocks_ptr + ((n * block_rows + block_r) * block_cols + block_c[None, :]) * channels + offs_c[:, None]
    tl.store(out, per_block.to(tl.int8), mask=c_ok[:, None] & (block_c < block_cols)[None, :])


@triton.jit
def _append_active(active, offs_c, c_ok, count, index_row):
    """Writes the channels `offs_c` whose `active` flag is set to the list at `index_row`, after its
    first `count` entries; returns the new count."""
    slot = count + tl.cumsum(active, axis=0) - 1
    tl.store(index_row + slot, offs_c, mask=c_ok & (active != 0))
    return count + tl.sum(active, axis=0)


@triton.jit
def window_bounds(tile, tiles_w, out_h, out_w, height, width, stride_h, stride_w, pad_h, pad_w, reach_h, reach_w,
                  TILE_H: tl.constexpr, TILE_W: tl.constexpr):
    """Input rows and cols read by output tile `tile`'s window, clamped to the image:
    (lo_h, hi_h, lo_w, hi_w), empty (lo > hi) if the window covers padding only."""
    tile_r = tile // tiles_w
    tile_c = tile % tiles_w
    lo_h = tl.maximum(tile_r * TILE_H * stride_h - pad_h, 0)
    hi_h = tl.minimum((tl.minimum(tile_r * TILE_H + TILE_H, out_h) - 1) * stride_h - pad_h + reach_h, height - 1)
    lo_w = tl.maximum(tile_c * TILE_W * stride_w - pad_w, 0)
    hi_w = tl.minimum((tl.minimum(tile_c * TILE_W + TILE_W, out_w) - 1) * stride_w - pad_w + reach_w, width - 1)
    return lo_h, hi_h, lo_w, hi_w


@triton.jit
def window_flags(blocks_ptr, n, offs_c, c_ok, channels, block_rows, block_cols, lo_h, hi_h, lo_w, hi_w,
                 BLOCK: tl.constexpr, MAX_BLOCKS_H: tl.constexpr, MAX_BLOCKS_W: tl.constexpr):
    """int32 flags of channels `offs_c` of sample n: 1 where a block under the window holds a
    non-zero. The block loads are independent (static loops), so they are all in flight at once."""
    window_ok = (lo_h <= hi_h) & (lo_w <= hi_w)
    active = tl.zeros(offs_c.shape, tl.int32)
    for i in tl.static_range(MAX_BLOCKS_H):
        block_r = lo_h // BLOCK + i
        for j in tl.static_range(MAX_BLOCKS_W):
            block_c = lo_w // BLOCK + j
            in_window = window_ok & (block_r <= hi_h // BLOCK) & (block_c <= hi_w // BLOCK)
            flag = tl.load(blocks_ptr + ((n * block_rows + block_r) * block_cols + block_c) * channels + offs_c,
                           mask=c_ok & in_window, other=0)
            active = tl.maximum(active, flag.to(tl.int32))
    return active


@triton.jit(do_not_specialize=["stride_h", "stride_w", "pad_h", "pad_w"])
def _tile_activity_kernel(
    blocks_ptr, active_ptr, index_ptr, count_ptr,
    channels, block_rows, block_cols, tiles_w, out_h, out_w, height, width,
    stride_h, stride_w, pad_h, pad_w, reach_h, reach_w,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK: tl.constexpr,
    MAX_BLOCKS_H: tl.constexpr, MAX_BLOCKS_W: tl.constexpr, CHUNK_C: tl.constexpr,
):
    tile = tl.program_id(0)
    n = tl.program_id(1)
    pair = n * tl.num_programs(0) + tile
    lo_h, hi_h, lo_w, hi_w = window_bounds(tile, tiles_w, out_h, out_w, height, width, stride_h, stride_w,
                                           pad_h, pad_w, reach_h, reach_w, TILE_H, TILE_W)
    count = tl.full((), 0, tl.int32)
    c0 = 0
    while c0 < channels:
        offs_c = c0 + tl.arange(0, CHUNK_C)
        c_ok = offs_c < channels
        active = window_flags(blocks_ptr, n, offs_c, c_ok, channels, block_rows, block_cols, lo_h, hi_h, lo_w, hi_w,
                              BLOCK, MAX_BLOCKS_H, MAX_BLOCKS_W)
        tl.store(active_ptr + pair * channels + offs_c, active.to(tl.int8), mask=c_ok)
        count = _append_active(active, offs_c, c_ok, count, index_ptr + pair * channels)
        c0 += CHUNK_C
    tl.store(count_ptr + pair, count)


@triton.jit(do_not_specialize=["stride_h", "stride_w", "pad_h", "pad_w"])
def _window_activity_kernel(
    blocks_ptr, active_ptr,
    channels, block_rows, block_cols, tiles_w, out_h, out_w, height, width,
    stride_h, stride_w, pad_h, pad_w, reach_h, reach_w,
    TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK: tl.constexpr,
    MAX_BLOCKS_H: tl.constexpr, MAX_BLOCKS_W: tl.constexpr, CHUNK_C: tl.constexpr,
):
    # The flags of `_tile_activity_kernel` without its lists; channels past CHUNK_C get programs
    # of their own.
    offs_c = tl.program_id(0) * CHUNK_C + tl.arange(0, CHUNK_C)
    tile = tl.program_id(1)
    n = tl.program_id(2)
    c_ok = offs_c < channels
    lo_h, hi_h, lo_w, hi_w = window_bounds(tile, tiles_w, out_h, out_w, height, width, stride_h, stride_w,
                                           pad_h, pad_w, reach_h, reach_w, TILE_H, TILE_W)
    active = window_flags(blocks_ptr, n, offs_c, c_ok, channels, block_rows, block_cols, lo_h, hi_h, lo_w, hi_w,
                          BLOCK, MAX_BLOCKS_H, MAX_BLOCKS_W)
    tl.store(active_ptr + (n * tl.num_programs(1) + tile) * channels + offs_c, active.to(tl.int8), mask=c_ok)


def _chunk(channels: int) -> int:
    return min(256, next_pow2(channels))


def block_activity(x: torch.Tensor, elements: int = BLOCK_MAP_ELEMENTS,
                   num_warps: int = BLOCK_MAP_WARPS) -> torch.Tensor:
    """int8 [N, ceil(H/8), ceil(W/8), C]: 1 where the block of x holds a non-zero. `elements` (x
    elements per program) and `num_warps` are tuning knobs (benchmarks/bench_sparse_conv.py --sweep, git 3b7d88c)."""
    batch, channels, height, width = x.shape
    block_rows, block_cols = cdiv(height, BLOCK), cdiv(width, BLOCK)
    blocks = torch.empty((batch, block_rows, block_cols, channels), device=x.device, dtype=torch.int8)
    padded_width = next_pow2(block_cols * BLOCK)
    block_c = max(1, min(elements // (BLOCK * padded_width), next_pow2(channels)))
    pdl = use_pdl(x)
    _block_activity_kernel[(cdiv(channels, block_c), block_rows, batch)](
        x, blocks, channels, height, width, block_rows, block_cols, *x.stride(),
        BLOCK_C=block_c, BLOCK=BLOCK, WIDTH=padded_width, PDL=pdl, num_warps=num_warps, launch_pdl=pdl,
    )
    return blocks


def tile_activity(
    blocks: torch.Tensor, geometry: ConvGeometry
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per (sample, output tile of `geometry`): `active` int8 [N, tiles, C], the active channels
    listed in ascending order in `index` int32 [N, tiles, C] (entries past `count` are unset),
    `count` int32 [N, tiles]."""
    channels = geometry.in_channels
    shape = (geometry.batch, geometry.tiles, channels)
    active = torch.empty(shape, device=blocks.device, dtype=torch.int8)
    index = torch.empty(shape, device=blocks.device, dtype=torch.int32)
    count = torch.empty(shape[:2], device=blocks.device, dtype=torch.int32)
    args, constexprs = _window_args(geometry)
    _tile_activity_kernel[(geometry.tiles, geometry.batch)](
        blocks, active, index, count, *args, **constexprs, CHUNK_C=_chunk(channels),
    )
    return active, index, count


def _window_args(geometry: ConvGeometry) -> tuple[tuple[int, ...], dict[str, int]]:
    """The shape arguments and constexprs that the tile-window kernels share."""
    rows, cols = geometry.rows, geometry.cols
    args = (geometry.in_channels, rows.blocks, cols.blocks, cols.tiles, rows.out_size, cols.out_size, rows.size,
            cols.size, rows.stride, cols.stride, rows.padding, cols.padding,
            (rows.kernel - 1) * rows.dilation, (cols.kernel - 1) * cols.dilation)
    constexprs = dict(TILE_H=rows.tile, TILE_W=cols.tile, BLOCK=BLOCK,
                      MAX_BLOCKS_H=rows.max_blocks_per_tile, MAX_BLOCKS_W=cols.max_blocks_per_tile)
    return args, constexprs


def window_activity(blocks: torch.Tensor, geometry: ConvGeometry, chunk: int = WINDOW_ACTIVITY_CHUNK) -> torch.Tensor:
    """`tile_activity`'s `active` int8 [N, tiles, C] alone (what the depthwise forward reads),
    from a kernel that makes no lists."""
    channels = geometry.in_channels
    active = torch.empty((geometry.batch, geometry.tiles, channels), device=blocks.device, dtype=torch.int8)
    chunk = min(chunk, next_pow2(channels))
    args, constexprs = _window_args(geometry)
    _window_activity_kernel[(cdiv(channels, chunk), geometry.tiles, geometry.batch)](
        blocks, active, *args, **constexprs, CHUNK_C=chunk,
    )
    return active
