"""Triton kernels of the spike-sparse convolution and their launchers.

Stage 1 (prescan), two small kernels without host syncs:
  `_block_activity_kernel`  reads x once: int8 [N, H/8, W/8, C] "block holds a non-zero"
                            (channels innermost, so the next kernel reads them contiguously);
  `_tile_activity_kernel`   per (sample, output tile): ORs the flags of the blocks under the
                            tile's input window -> `active` [N, tiles, C] (int8), and compacts
                            the active channels into `index` [N, tiles, C] with `count` [N, tiles].
Stage 2, scatter-free: each program owns one output tile and reads only what touches it.
  `_sparse_conv_fwd_kernel`  dense weights (groups=1): implicit GEMM over the tile's active
                             channels, packed BLOCK_K at a time (gathered loads), several
                             kernel taps per tl.dot (K = taps x channels);
                             fp16/bf16 in, fp32 accumulate; fp32 in runs on TF32 tensor cores
                             (cuDNN's default for fp32 convolutions too).
  `_sparse_depthwise_fwd_kernel`  depthwise: loads of silent channels are masked off (no traffic).
Weight gradients (input sparsity, a split reduction over (sample, tile), no atomics):
  `_sparse_conv_wgrad_kernel`, `_sparse_depthwise_wgrad_kernel`.
Loops with a run-time bound are written as `while` loops: Triton 3.6's interpreter (how CI
runs these kernels) fails on range() with a run-time bound under numpy >= 2.4
(triton-lang/triton#9171). Little is lost to the missing software pipelining: the forward loop
runs one or two trips in the sparse regime, and the weight-gradient loops branch on the data
every trip.
All kernels take strides, so NCHW, channels_last and the flattened [T*B, C, H, W] all work;
the output takes the input's memory format. The grid never depends on the data, so the path
is CUDA-graph capturable.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from kernels.sparse_conv.geometry import BLOCK, ConvGeometry


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes; the defaults come from the sweep in benchmarks/bench_sparse_conv.py."""

    tile_h: int = 8  # output tile (the unit of skipping and of the GEMM's M = tile_h * tile_w)
    tile_w: int = 8
    block_k: int = 16  # active input channels per tl.dot
    taps_per_dot: int = 8  # kernel taps per tl.dot (its K = taps_per_dot * block_k)
    num_warps: int = 4
    depthwise_block_c: int = 32
    depthwise_num_warps: int = 4
    wgrad_rows: int = 128  # rows of the weight-gradient tile: (tap, channel) pairs
    wgrad_block_n: int = 128
    wgrad_num_warps: int = 4


DEFAULT_CONFIG = KernelConfig()
_MAX_WGRAD_PARTIAL_BYTES = 8 << 20  # bound on the split reduction's scratch buffer


# Conv parameters stay run-time values: specializing on them (Triton does for ints equal to 1)
# would compile a variant per stride/padding/dilation combination without a faster kernel.
_CONV_ARGS = ["stride_h", "stride_w", "pad_h", "pad_w", "dil_h", "dil_w"]


def _next_pow2(value: int) -> int:
    return triton.next_power_of_2(max(int(value), 1))


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def interpreted() -> bool:
    """True when the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return isinstance(_block_activity_kernel, InterpretedFunction)


def _dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand type of tl.dot: the input's own. Triton 3.6's interpreter multiplies the raw bit
    patterns of bf16 operands, so there bf16 is widened to fp32 (exact products, fp32 sums)."""
    if dtype == torch.bfloat16 and interpreted():
        return tl.float32
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]


# ----------------------------------------------------------------------------------- stage 1
@triton.jit
def _block_activity_kernel(
    x_ptr, blocks_ptr,
    channels, height, width, block_cols,
    stride_n, stride_c, stride_h, stride_w,
    BLOCK_C: tl.constexpr, BLOCK: tl.constexpr,
):
    # One program: one BLOCK x BLOCK block of BLOCK_C channels, loaded as [pixels, channels]
    # (whichever axis is contiguous in memory gets vectorized loads) and reduced over pixels.
    block = tl.program_id(0)
    n = tl.program_id(1)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_p = tl.arange(0, BLOCK * BLOCK)
    rows = (block // block_cols) * BLOCK + offs_p // BLOCK
    cols = (block % block_cols) * BLOCK + offs_p % BLOCK
    c_ok = offs_c < channels
    mask = ((rows < height) & (cols < width))[:, None] & c_ok[None, :]
    ptrs = x_ptr + n.to(tl.int64) * stride_n + (rows * stride_h + cols * stride_w)[:, None] + offs_c[None, :] * stride_c
    nonzero = (tl.load(ptrs, mask=mask, other=0.0) != 0).to(tl.int32)  # NaN counts as non-zero
    out = blocks_ptr + (n * tl.num_programs(0) + block) * channels + offs_c
    tl.store(out, tl.max(nonzero, axis=0).to(tl.int8), mask=c_ok)


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
    tile_r = tile // tiles_w
    tile_c = tile % tiles_w
    # Input rows/cols read by the tile's window, clamped to the image (empty if only padding).
    lo_h = tl.maximum(tile_r * TILE_H * stride_h - pad_h, 0)
    hi_h = tl.minimum((tl.minimum(tile_r * TILE_H + TILE_H, out_h) - 1) * stride_h - pad_h + reach_h, height - 1)
    lo_w = tl.maximum(tile_c * TILE_W * stride_w - pad_w, 0)
    hi_w = tl.minimum((tl.minimum(tile_c * TILE_W + TILE_W, out_w) - 1) * stride_w - pad_w + reach_w, width - 1)
    window_ok = (lo_h <= hi_h) & (lo_w <= hi_w)
    count = tl.full((), 0, tl.int32)
    c0 = 0
    while c0 < channels:
        offs_c = c0 + tl.arange(0, CHUNK_C)
        c_ok = offs_c < channels
        active = tl.zeros((CHUNK_C,), tl.int32)
        for i in tl.static_range(MAX_BLOCKS_H):
            block_r = lo_h // BLOCK + i
            for j in tl.static_range(MAX_BLOCKS_W):
                block_c = lo_w // BLOCK + j
                in_window = window_ok & (block_r <= hi_h // BLOCK) & (block_c <= hi_w // BLOCK)
                flag = tl.load(blocks_ptr + ((n * block_rows + block_r) * block_cols + block_c) * channels + offs_c,
                               mask=c_ok & in_window, other=0)
                active = tl.maximum(active, flag.to(tl.int32))
        tl.store(active_ptr + pair * channels + offs_c, active.to(tl.int8), mask=c_ok)
        slot = count + tl.cumsum(active, axis=0) - 1
        tl.store(index_ptr + pair * channels + slot, offs_c, mask=c_ok & (active != 0))
        count += tl.sum(active, axis=0)
        c0 += CHUNK_C
    tl.store(count_ptr + pair, count)


def block_activity(x: torch.Tensor) -> torch.Tensor:
    """int8 [N, ceil(H/8), ceil(W/8), C]: 1 where the block of x holds a non-zero."""
    batch, channels, height, width = x.shape
    block_rows, block_cols = triton.cdiv(height, BLOCK), triton.cdiv(width, BLOCK)
    blocks = torch.empty((batch, block_rows, block_cols, channels), device=x.device, dtype=torch.int8)
    block_c = min(64, _next_pow2(channels))
    _block_activity_kernel[(block_rows * block_cols, batch, triton.cdiv(channels, block_c))](
        x, blocks, channels, height, width, block_cols, *x.stride(), BLOCK_C=block_c, BLOCK=BLOCK,
    )
    return blocks


def tile_activity(
    blocks: torch.Tensor, geometry: ConvGeometry
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per (sample, output tile): `active` int8 [N, tiles, C], the active channels compacted in
    ascending order into `index` int32 [N, tiles, C] (entries past `count` are unset), `count`
    int32 [N, tiles]."""
    rows, cols, channels = geometry.rows, geometry.cols, geometry.in_channels
    shape = (geometry.batch, geometry.tiles, channels)
    active = torch.empty(shape, device=blocks.device, dtype=torch.int8)
    index = torch.empty(shape, device=blocks.device, dtype=torch.int32)
    count = torch.empty(shape[:2], device=blocks.device, dtype=torch.int32)
    _tile_activity_kernel[(geometry.tiles, geometry.batch)](
        blocks, active, index, count,
        channels, rows.blocks, cols.blocks, cols.tiles, rows.out_size, cols.out_size, rows.size, cols.size,
        rows.stride, cols.stride, rows.padding, cols.padding,
        (rows.kernel - 1) * rows.dilation, (cols.kernel - 1) * cols.dilation,
        TILE_H=rows.tile, TILE_W=cols.tile, BLOCK=BLOCK,
        MAX_BLOCKS_H=rows.max_blocks_per_tile, MAX_BLOCKS_W=cols.max_blocks_per_tile,
        CHUNK_C=min(256, _next_pow2(channels)),
    )
    return active, index, count


def prescan(x: torch.Tensor, geometry: ConvGeometry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage 1: `active`, `index`, `count` of `tile_activity` straight from x."""
    return tile_activity(block_activity(x), geometry)


def work_fractions(active: torch.Tensor, count: torch.Tensor, geometry: ConvGeometry,
                   config: KernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """float32 [2] on the device: the fraction of the dense work that the forward and the
    weight-gradient kernels do for this activity (what their run time is linear in)."""
    if geometry.is_depthwise:
        fraction = active.float().mean()
        return torch.stack([fraction, fraction])
    forward = torch.div(count + config.block_k - 1, config.block_k, rounding_mode="floor").float().mean()
    forward = forward / triton.cdiv(geometry.in_channels, config.block_k)
    chunk = _wgrad_chunk(geometry, config)
    padded = torch.nn.functional.pad(active, (0, -geometry.in_channels % chunk))
    wgrad = padded.view(*active.shape[:2], -1, chunk).amax(dim=3).float().mean()
    return torch.stack([forward, wgrad])


# ----------------------------------------------------------------------------------- stage 2
@triton.jit
def _accumulate_taps(
    acc, x_base, wt_ptr, index_ptr, k0, active_channels, oh, ow, pix_ok, offs_co, co_ok,
    in_channels, out_channels, height, width, sx_c, sx_h, sx_w,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    FIRST_TAP: tl.constexpr, GROUP: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
    BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    """acc += taps FIRST_TAP .. FIRST_TAP + GROUP - 1 (those that exist) of the BLOCK_K active
    channels listed from position k0: one gathered im2col tile [pixels, (tap, channel)], one dot."""
    offs_j = tl.arange(0, GROUP * BLOCK_K)
    slot = k0 + offs_j % BLOCK_K
    tap = FIRST_TAP + offs_j // BLOCK_K
    col_ok = (slot < active_channels) & (tap < KH * KW)
    ci = tl.load(index_ptr + slot, mask=col_ok, other=0)
    ih = oh[:, None] * stride_h - pad_h + (tap // KW)[None, :] * dil_h
    iw = ow[:, None] * stride_w - pad_w + (tap % KW)[None, :] * dil_w
    a_ok = pix_ok[:, None] & col_ok[None, :] & (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)
    a = tl.load(x_base + ci[None, :] * sx_c + ih * sx_h + iw * sx_w, mask=a_ok, other=0.0)
    b = tl.load(wt_ptr + (tap[:, None] * in_channels + ci[:, None]) * out_channels + offs_co[None, :],
                mask=col_ok[:, None] & co_ok[None, :], other=0.0)
    return tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc, input_precision="tf32")  # TF32: fp32 only


@triton.jit(do_not_specialize=_CONV_ARGS)
def _sparse_conv_fwd_kernel(
    x_ptr, wt_ptr, bias_ptr, y_ptr, index_ptr, count_ptr,
    in_channels, out_channels, height, width, out_h, out_w, tiles_w,
    sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    BLOCK_K: tl.constexpr, TAPS_PER_DOT: tl.constexpr, REST_TAPS: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    # Taps go TAPS_PER_DOT at a time into one dot (fewer, larger, independent gathers); the
    # REST_TAPS left over (padded to a power of two) go into one narrower dot.
    co_block = tl.program_id(0)
    tile = tl.program_id(1)
    n = tl.program_id(2)
    pair = n * tl.num_programs(1) + tile
    offs_m = tl.arange(0, TILE_H * TILE_W)
    oh = (tile // tiles_w) * TILE_H + offs_m // TILE_W
    ow = (tile % tiles_w) * TILE_W + offs_m % TILE_W
    pix_ok = (oh < out_h) & (ow < out_w)
    offs_co = co_block * BLOCK_N + tl.arange(0, BLOCK_N)
    co_ok = offs_co < out_channels
    x_base = x_ptr + n.to(tl.int64) * sx_n
    index_row = index_ptr + pair * in_channels
    full_taps: tl.constexpr = (KH * KW) // TAPS_PER_DOT * TAPS_PER_DOT
    acc = tl.zeros((TILE_H * TILE_W, BLOCK_N), tl.float32)
    active_channels = tl.load(count_ptr + pair)
    k0 = 0
    while k0 < active_channels:
        for first in tl.static_range(0, full_taps, TAPS_PER_DOT):
            acc = _accumulate_taps(
                acc, x_base, wt_ptr, index_row, k0, active_channels, oh, ow, pix_ok, offs_co, co_ok,
                in_channels, out_channels, height, width, sx_c, sx_h, sx_w,
                stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                first, TAPS_PER_DOT, KH, KW, BLOCK_K, DOT_DTYPE,
            )
        if REST_TAPS > 0:
            acc = _accumulate_taps(
                acc, x_base, wt_ptr, index_row, k0, active_channels, oh, ow, pix_ok, offs_co, co_ok,
                in_channels, out_channels, height, width, sx_c, sx_h, sx_w,
                stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                full_taps, REST_TAPS, KH, KW, BLOCK_K, DOT_DTYPE,
            )
        k0 += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_co, mask=co_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + n.to(tl.int64) * sy_n + offs_co[None, :] * sy_c + oh[:, None] * sy_h + ow[:, None] * sy_w
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=pix_ok[:, None] & co_ok[None, :])


@triton.jit(do_not_specialize=_CONV_ARGS)
def _sparse_depthwise_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, active_ptr,
    channels, height, width, out_h, out_w, tiles_w,
    sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    tile = tl.program_id(1)
    n = tl.program_id(2)
    pair = n * tl.num_programs(1) + tile
    c_ok = offs_c < channels
    c_active = tl.load(active_ptr + pair * channels + offs_c, mask=c_ok, other=0) != 0
    offs_m = tl.arange(0, TILE_H * TILE_W)
    oh = (tile // tiles_w) * TILE_H + offs_m // TILE_W
    ow = (tile % tiles_w) * TILE_W + offs_m % TILE_W
    pix_ok = (oh < out_h) & (ow < out_w)
    x_base = x_ptr + n.to(tl.int64) * sx_n + offs_c[None, :] * sx_c
    acc = tl.zeros((TILE_H * TILE_W, BLOCK_C), tl.float32)
    for kh in tl.static_range(KH):
        ih = oh * stride_h - pad_h + kh * dil_h
        row_ok = pix_ok & (ih >= 0) & (ih < height)
        for kw in tl.static_range(KW):
            iw = ow * stride_w - pad_w + kw * dil_w
            ok = (row_ok & (iw >= 0) & (iw < width))[:, None] & c_active[None, :]  # silent: no load
            xv = tl.load(x_base + ih[:, None] * sx_h + iw[:, None] * sx_w, mask=ok, other=0.0)
            wv = tl.load(w_ptr + offs_c * (KH * KW) + kh * KW + kw, mask=c_ok, other=0.0)
            acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + n.to(tl.int64) * sy_n + offs_c[None, :] * sy_c + oh[:, None] * sy_h + ow[:, None] * sy_w
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=pix_ok[:, None] & c_ok[None, :])


def _empty_output(x: torch.Tensor, geometry: ConvGeometry) -> torch.Tensor:
    return torch.empty(geometry.output_shape, device=x.device, dtype=x.dtype, memory_format=_memory_format(x))


def _conv_args(geometry: ConvGeometry) -> tuple[int, ...]:
    rows, cols = geometry.rows, geometry.cols
    return (rows.stride, cols.stride, rows.padding, cols.padding, rows.dilation, cols.dilation)


def sparse_conv_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry: ConvGeometry,
    index: torch.Tensor, count: torch.Tensor, config: KernelConfig = DEFAULT_CONFIG,
) -> torch.Tensor:
    """Stage 2 for dense weights (groups=1): y from the active channels listed per tile."""
    rows, cols = geometry.rows, geometry.cols
    y = _empty_output(x, geometry)
    weight_by_tap = weight.permute(2, 3, 1, 0).contiguous()  # [KH, KW, C_in, C_out]: rows by channel
    block_n = min(128, max(16, _next_pow2(geometry.out_channels)))
    rest = geometry.taps % config.taps_per_dot
    rest_taps = _next_pow2(rest) if rest else 0
    grid = (triton.cdiv(geometry.out_channels, block_n), geometry.tiles, geometry.batch)
    _sparse_conv_fwd_kernel[grid](
        x, weight_by_tap, bias if bias is not None else weight_by_tap, y, index, count,
        geometry.in_channels, geometry.out_channels, rows.size, cols.size, rows.out_size, cols.out_size,
        cols.tiles, *x.stride(), *y.stride(), *_conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        BLOCK_K=config.block_k, TAPS_PER_DOT=config.taps_per_dot, REST_TAPS=rest_taps, BLOCK_N=block_n,
        HAS_BIAS=bias is not None, DOT_DTYPE=_dot_dtype(x.dtype),
        num_warps=config.num_warps,
    )
    return y


def sparse_depthwise_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry: ConvGeometry,
    active: torch.Tensor, config: KernelConfig = DEFAULT_CONFIG,
) -> torch.Tensor:
    """Stage 2 for depthwise weights [C, 1, KH, KW]: silent channels of a tile are not read."""
    rows, cols = geometry.rows, geometry.cols
    y = _empty_output(x, geometry)
    weight = weight.contiguous()
    block_c = min(config.depthwise_block_c, _next_pow2(geometry.in_channels))
    grid = (triton.cdiv(geometry.in_channels, block_c), geometry.tiles, geometry.batch)
    _sparse_depthwise_fwd_kernel[grid](
        x, weight, bias if bias is not None else weight, y, active,
        geometry.in_channels, rows.size, cols.size, rows.out_size, cols.out_size, cols.tiles,
        *x.stride(), *y.stride(), *_conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        BLOCK_C=block_c, HAS_BIAS=bias is not None, num_warps=config.depthwise_num_warps,
    )
    return y


# ---------------------------------------------------------------------------- weight gradient
@triton.jit(do_not_specialize=_CONV_ARGS)
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


@triton.jit(do_not_specialize=_CONV_ARGS)
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


def _wgrad_chunk(geometry: ConvGeometry, config: KernelConfig) -> int:
    """Input channels per weight-gradient program: rows = (padded taps) x channels."""
    return max(1, config.wgrad_rows // _next_pow2(geometry.taps))


def _split_count(x: torch.Tensor, programs: int, pairs: int, partial_bytes_per_split: int) -> int:
    """How many ways the (sample, tile) reduction is split: enough programs to fill the GPU,
    within the scratch-buffer bound."""
    target = 4 * torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
    by_memory = max(1, _MAX_WGRAD_PARTIAL_BYTES // partial_bytes_per_split)
    return max(1, min(triton.cdiv(target, programs), pairs, by_memory))


def sparse_conv_wgrad(
    x: torch.Tensor, grad_y: torch.Tensor, geometry: ConvGeometry, active: torch.Tensor,
    weight_dtype: torch.dtype, config: KernelConfig = DEFAULT_CONFIG,
) -> torch.Tensor:
    """dL/dW [C_out, C_in, KH, KW] for dense weights, from the active (sample, tile, channel)s."""
    rows, cols = geometry.rows, geometry.cols
    taps, c_in, c_out = geometry.taps, geometry.in_channels, geometry.out_channels
    chunk = _wgrad_chunk(geometry, config)
    block_n = min(config.wgrad_block_n, max(16, _next_pow2(c_out)))
    programs = triton.cdiv(c_in, chunk) * triton.cdiv(c_out, block_n)
    pairs = geometry.batch * geometry.tiles
    splits = _split_count(x, programs, pairs, taps * c_in * c_out * 4)
    partial = torch.empty((splits, taps, c_in, c_out), device=x.device, dtype=torch.float32)
    _sparse_conv_wgrad_kernel[(programs, splits)](
        x, grad_y, active, partial,
        c_in, c_out, rows.size, cols.size, rows.out_size, cols.out_size, geometry.tiles, cols.tiles, pairs,
        *x.stride(), *grad_y.stride(), *_conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        CHUNK_C=chunk, TAPS_PAD=_next_pow2(taps), BLOCK_N=block_n,
        DOT_DTYPE=_dot_dtype(x.dtype),
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
    block_c = min(config.depthwise_block_c, _next_pow2(channels))
    programs = triton.cdiv(channels, block_c)
    pairs = geometry.batch * geometry.tiles
    splits = _split_count(x, programs, pairs, taps * channels * 4)
    partial = torch.empty((splits, taps, channels), device=x.device, dtype=torch.float32)
    _sparse_depthwise_wgrad_kernel[(programs, splits)](
        x, grad_y, active, partial,
        channels, rows.size, cols.size, rows.out_size, cols.out_size, geometry.tiles, cols.tiles, pairs,
        *x.stride(), *grad_y.stride(), *_conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        TAPS_PAD=_next_pow2(taps), BLOCK_C=block_c, num_warps=config.depthwise_num_warps,
    )
    grad_w = partial.sum(dim=0).view(rows.kernel, cols.kernel, channels).permute(2, 0, 1).unsqueeze(1)
    return grad_w.to(weight_dtype).contiguous()
