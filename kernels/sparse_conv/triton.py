"""Stage-2 Triton kernels of the spike-sparse convolution on planar layouts (NCHW and its views): the forward,
and the tile sizes and launch helpers that the weight gradients (`wgrad.py`) share. Stage 1 is `prescan.py`,
or the block map of the ST-BIF kernel.

  `_sparse_conv_fwd_kernel`       dense weights: an implicit GEMM (tl.dot) over the active channels
                                  of each output tile, listed in registers from the block map;
                                  stride-1 calls take `packed.py`'s forward (KernelConfig.packed).
  `_sparse_depthwise_fwd_kernel`  depthwise, row bands of whole planes; silent channels skipped.

Grids depend on shapes only (graph-capturable).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from kernels.sparse_conv.geometry import BLOCK, ConvGeometry, cdiv, next_pow2
from kernels.sparse_conv.packed import pack_active_channels, packed_conv_fwd, packed_forward_available
from kernels.sparse_conv.prescan import tile_activity, window_activity, window_bounds, window_flags


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes; the sweep of benchmarks/bench_sparse_conv.py (git history, 3b7d88c) timed alternatives on the GPU."""

    forward_pixels: int = 128  # output pixels per forward program (the GEMM's M), a power of two
    forward_block_k: int = 16  # active input channels per tl.dot (its K): little padding when few are active
    forward_block_n: int = 128  # output channels per forward program (the GEMM's N)
    forward_num_warps: int = 4  # 4 beat 8 on every input swept
    forward_num_stages: int = 2  # software pipelining of the tap loop
    # Depthwise forward: row bands of up to depthwise_pixels, and as many channels (at least
    # depthwise_block_c) as make about that many outputs per program: one channel on 32x32 planes,
    # so that a silent plane is one program that only writes the bias.
    depthwise_block_c: int = 1
    depthwise_pixels: int = 1024
    depthwise_num_warps: int = 4
    depthwise_wgrad_block_c: int = 32  # channels per depthwise weight-gradient program
    wgrad_rows: int = 128  # rows of the weight-gradient tile: (tap, channel) pairs
    wgrad_block_n: int = 128
    wgrad_num_warps: int = 4
    packed: bool | None = None  # stride-1 dense forward on packed input (packed.py); None: wherever it applies
    packed_num_stages: int = 4
    pack_active_pixels: int = 512  # pixels per program of packed.py's packing
    pack_active_num_warps: int = 2


DEFAULT_CONFIG = KernelConfig()
# The depthwise forward unrolls its channel loop up to this many channel x tap bodies: longer
# unrolled bodies compile for tens of seconds and run no faster.
DEPTHWISE_UNROLL_TAPS = 100


# Conv parameters stay run-time values: specializing on them (Triton does for ints equal to 1)
# would compile a variant per stride/padding/dilation combination without a faster kernel.
CONV_ARGS = ["stride_h", "stride_w", "pad_h", "pad_w", "dil_h", "dil_w"]


def interpreted() -> bool:
    """True when the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return isinstance(_sparse_conv_fwd_kernel, InterpretedFunction)


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand type of tl.dot: the input's own. Triton 3.6's interpreter multiplies the raw bit
    patterns of bf16 operands, so there bf16 is widened to fp32 (exact products, fp32 sums)."""
    if dtype == torch.bfloat16 and interpreted():
        return tl.float32
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]


def conv_args(geometry: ConvGeometry) -> tuple[int, ...]:
    rows, cols = geometry.rows, geometry.cols
    return (rows.stride, cols.stride, rows.padding, cols.padding, rows.dilation, cols.dilation)


def _empty_output(x: torch.Tensor, geometry: ConvGeometry) -> torch.Tensor:
    return torch.empty(geometry.output_shape, device=x.device, dtype=x.dtype)


# ------------------------------------------------------------------------------ dense forward
@triton.jit
def _nth_active(active, rank, slots):
    """The channels holding ranks `slots` among the set `active` flags ([C_PAD] int32 flags and
    their exclusive ranks): the compaction of the active-channel list, done in registers."""
    channel = tl.arange(0, active.shape[0])
    match = (active[None, :] != 0) & (rank[None, :] == slots[:, None])
    return tl.sum(tl.where(match, channel[None, :], 0), axis=1)


@triton.jit
def _tile_pixels(tile, tiles_w, out_h, out_w, TILE_H: tl.constexpr, TILE_W: tl.constexpr):
    """(oh, ow, inside the output) of the pixels of output tile `tile`, row by row."""
    offs = tl.arange(0, TILE_H * TILE_W)
    oh = (tile // tiles_w) * TILE_H + offs // TILE_W
    ow = (tile % tiles_w) * TILE_W + offs % TILE_W
    return oh, ow, (oh < out_h) & (ow < out_w)


@triton.jit(do_not_specialize=CONV_ARGS)
def _sparse_conv_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, blocks_ptr,
    in_channels, out_channels, height, width, out_h, out_w, tiles_w, block_rows, block_cols,
    sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w, sw_o, sw_i, sw_h, sw_w,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    HAS_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr,
    C_PAD: tl.constexpr, BLOCK: tl.constexpr, MAX_BLOCKS_H: tl.constexpr, MAX_BLOCKS_W: tl.constexpr,
):
    # Output-channel blocks vary fastest: programs of one tile run together and share its X in L2.
    # The program ORs the block map under its tile's window itself and compacts the active
    # channels in registers: no list kernel, no list buffer.
    co_block = tl.program_id(0)
    tile = tl.program_id(1)
    n = tl.num_programs(2) - 1 - tl.program_id(2)  # back to front: the prescan's last reads are in L2
    oh, ow, pix_ok = _tile_pixels(tile, tiles_w, out_h, out_w, TILE_H, TILE_W)
    offs_co = co_block * BLOCK_N + tl.arange(0, BLOCK_N)
    co_ok = offs_co < out_channels
    offs_k = tl.arange(0, BLOCK_K)
    x_base = x_ptr + n.to(tl.int64) * sx_n
    acc = tl.zeros((TILE_H * TILE_W, BLOCK_N), tl.float32)
    lo_h, hi_h, lo_w, hi_w = window_bounds(
        tile, tiles_w, out_h, out_w, height, width, stride_h, stride_w, pad_h, pad_w,
        (KH - 1) * dil_h, (KW - 1) * dil_w, TILE_H, TILE_W)
    offs_c = tl.arange(0, C_PAD)
    active = window_flags(blocks_ptr, n, offs_c, offs_c < in_channels, in_channels, block_rows, block_cols,
                          lo_h, hi_h, lo_w, hi_w, BLOCK, MAX_BLOCKS_H, MAX_BLOCKS_W)
    rank = tl.cumsum(active, axis=0) - 1
    active_channels = tl.sum(active, axis=0)
    k0 = 0
    while k0 < active_channels:
        slot = k0 + offs_k
        k_ok = slot < active_channels
        ci = _nth_active(active, rank, slot)
        x_cols = x_base + ci[None, :] * sx_c
        w_rows = w_ptr + ci[:, None] * sw_i + offs_co[None, :] * sw_o
        for tap in tl.range(0, KH * KW, num_stages=NUM_STAGES):
            ih = oh * stride_h - pad_h + (tap // KW) * dil_h
            iw = ow * stride_w - pad_w + (tap % KW) * dil_w
            p_ok = pix_ok & (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)
            a = tl.load(x_cols + (ih * sx_h + iw * sx_w)[:, None], mask=p_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(w_rows + (tap // KW) * sw_h + (tap % KW) * sw_w, mask=k_ok[:, None] & co_ok[None, :], other=0.0)
            acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc, input_precision="tf32")  # TF32: fp32 only
        k0 += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_co, mask=co_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + n.to(tl.int64) * sy_n + offs_co[None, :] * sy_c + (oh * sy_h + ow * sy_w)[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=pix_ok[:, None] & co_ok[None, :])


def forward_tile(out_h: int, out_w: int, config: KernelConfig = DEFAULT_CONFIG) -> tuple[int, int]:
    """Output tile of a forward program: whole rows (up to config.forward_pixels pixels) where
    they fit, at least 16 pixels (tl.dot's minimum M)."""
    return _row_band_tile(out_h, out_w, config.forward_pixels)


def _row_band_tile(out_h: int, out_w: int, pixels: int) -> tuple[int, int]:
    tile_w = min(max(next_pow2(out_w), 8), pixels)
    tile_h = max(1, min(pixels // tile_w, next_pow2(out_h)), 16 // tile_w)
    return tile_h, tile_w


@dataclass(frozen=True)
class ForwardLists:
    """What the dense forward iterates over: its output tiling and the block map, from which the
    pointer forward lists each tile's active channels and the packed forward's packing each sample's."""

    geometry: ConvGeometry
    blocks: torch.Tensor
    packed: bool = False  # the packed forward (packed.py)


def forward_lists(x: torch.Tensor, blocks: torch.Tensor, geometry: ConvGeometry,
                  config: KernelConfig = DEFAULT_CONFIG) -> ForwardLists:
    """The dense forward's plan for input x with block map `blocks`."""
    return ForwardLists(forward_geometry(geometry, config), blocks, uses_packed_forward(geometry, config))


def uses_packed_forward(geometry: ConvGeometry, config: KernelConfig = DEFAULT_CONFIG) -> bool:
    """True when the dense forward of this call runs on packed input (packed.py)."""
    available = packed_forward_available(geometry)
    if config.packed and not available:
        raise ValueError("KernelConfig(packed=True) needs stride 1 and groups=1; "
                         "leave packed=None to use the packed forward where it applies")
    return available if config.packed is None else config.packed


@functools.lru_cache(maxsize=4096)
def forward_geometry(geometry: ConvGeometry, config: KernelConfig = DEFAULT_CONFIG) -> ConvGeometry:
    """`geometry` with the forward kernels' output tiles (cached: host work on every call)."""
    return geometry.retiled(forward_tile(geometry.rows.out_size, geometry.cols.out_size, config))


def forward_counts(x: torch.Tensor, lists: ForwardLists) -> torch.Tensor:
    """int32: how many active input channels each forward program iterates over ([N] per sample
    for the packed forward, [N, tiles] otherwise); a measurement for the dispatcher and the tests."""
    if lists.packed:
        return lists.blocks.amax(dim=(1, 2)).sum(dim=1, dtype=torch.int32)
    return tile_activity(lists.blocks, lists.geometry)[2]


def sparse_conv_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lists: ForwardLists,
    config: KernelConfig = DEFAULT_CONFIG,
) -> torch.Tensor:
    """Stage 2 for dense weights (groups=1): y from the active input channels only."""
    geometry = lists.geometry
    rows, cols = geometry.rows, geometry.cols
    y = _empty_output(x, geometry)
    block_n = min(config.forward_block_n, max(16, next_pow2(geometry.out_channels)))
    # Both forwards read the weight laid out [KH, KW, C_in, C_out] in memory: a channel's row of a
    # tap is then a contiguous C_out vector (reading [C_out, C_in, KH, KW] in place was slower
    # than the copy). The packed forward's packing kernel makes the copy; here a copy kernel does.
    if lists.packed:
        packed, index, count, weight_rows = pack_active_channels(
            x, lists.blocks, weight, config.pack_active_pixels, config.pack_active_num_warps)
        return packed_conv_fwd(packed, index, count, weight_rows, bias, y, geometry, block_n=block_n,
                               num_stages=config.packed_num_stages, num_warps=config.forward_num_warps,
                               dot_dtype=dot_dtype(x.dtype))
    weight = weight.permute(2, 3, 1, 0).contiguous().permute(3, 2, 0, 1)
    grid = (cdiv(geometry.out_channels, block_n), geometry.tiles, geometry.batch)
    blocks = lists.blocks
    _sparse_conv_fwd_kernel[grid](
        x, weight, bias if bias is not None else weight, y, blocks,
        geometry.in_channels, geometry.out_channels, rows.size, cols.size, rows.out_size, cols.out_size,
        cols.tiles, blocks.shape[1], blocks.shape[2], *x.stride(), *y.stride(), *weight.stride(),
        *conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        BLOCK_K=config.forward_block_k, BLOCK_N=block_n, NUM_STAGES=config.forward_num_stages,
        HAS_BIAS=bias is not None, DOT_DTYPE=dot_dtype(x.dtype),
        C_PAD=next_pow2(geometry.in_channels), BLOCK=BLOCK,
        MAX_BLOCKS_H=rows.max_blocks_per_tile, MAX_BLOCKS_W=cols.max_blocks_per_tile,
        num_warps=config.forward_num_warps,
    )
    return y


# ---------------------------------------------------------------------------------- depthwise
@triton.jit
def _depthwise_channel(x_ptr, w_ptr, bias_ptr, y_ptr, active_ptr, c, n, pair, oh, ow, pix_ok,
                       channels, height, width, sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
                       stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                       KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr):
    """Channel c of a program's row band: its KH x KW taps unless the channel is silent over the
    band's window (then only the bias is written)."""
    if c < channels:
        acc = tl.zeros(oh.shape, tl.float32)
        if tl.load(active_ptr + pair * channels + c) != 0:
            x_plane = x_ptr + n.to(tl.int64) * sx_n + c * sx_c
            for kh in tl.static_range(KH):
                ih = oh * stride_h - pad_h + kh * dil_h
                row_ok = pix_ok & (ih >= 0) & (ih < height)
                for kw in tl.static_range(KW):
                    iw = ow * stride_w - pad_w + kw * dil_w
                    xv = tl.load(x_plane + ih * sx_h + iw * sx_w, mask=row_ok & (iw >= 0) & (iw < width), other=0.0)
                    acc += xv.to(tl.float32) * tl.load(w_ptr + c * (KH * KW) + kh * KW + kw).to(tl.float32)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + c).to(tl.float32)
        y_ptrs = y_ptr + n.to(tl.int64) * sy_n + c * sy_c + oh * sy_h + ow * sy_w
        if EVEN:
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), eviction_policy="evict_first")
        else:
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=pix_ok, eviction_policy="evict_first")


# Conv parameters are specialized here (unlike CONV_ARGS elsewhere): stride, padding and dilation
# of 1 known at compile time make this kernel markedly faster, for a few more compiles.
@triton.jit
def _sparse_depthwise_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, active_ptr,
    channels, height, width, out_h, out_w, tiles_w,
    sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, UNROLL: tl.constexpr,
):
    # The program's channels one after the other, each a 1-D row band of its plane. EVEN (tiles
    # cover the output exactly) drops the store mask; UNROLL unrolls the channel loop (short bodies).
    tile = tl.program_id(1)
    n = tl.program_id(2)
    pair = n * tl.num_programs(1) + tile
    oh, ow, pix_ok = _tile_pixels(tile, tiles_w, out_h, out_w, TILE_H, TILE_W)
    if UNROLL:
        for j in tl.static_range(BLOCK_C):
            _depthwise_channel(x_ptr, w_ptr, bias_ptr, y_ptr, active_ptr, tl.program_id(0) * BLOCK_C + j, n, pair,
                               oh, ow, pix_ok, channels, height, width, sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
                               stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, KH, KW, HAS_BIAS, EVEN)
    else:
        for j in range(BLOCK_C):
            _depthwise_channel(x_ptr, w_ptr, bias_ptr, y_ptr, active_ptr, tl.program_id(0) * BLOCK_C + j, n, pair,
                               oh, ow, pix_ok, channels, height, width, sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
                               stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, KH, KW, HAS_BIAS, EVEN)


def depthwise_activity(x: torch.Tensor, blocks: torch.Tensor, geometry: ConvGeometry,
                       config: KernelConfig = DEFAULT_CONFIG, *, planes: torch.Tensor | None = None,
                       ) -> tuple[ConvGeometry, torch.Tensor]:
    """The depthwise forward's tiling (row bands) and its `active` flags [N, tiles, C]. Where one
    tile covers the whole output plane, the ST-BIF kernel's plane flags [N, C] (if given) are those
    flags as they are (a silent plane is a silent window); else the block map's windows are ORed."""
    tiled = depthwise_geometry(geometry, config)
    if planes is not None and tiled.tiles == 1:
        return tiled, planes.unsqueeze(1)
    return tiled, window_activity(blocks, tiled)


@functools.lru_cache(maxsize=4096)
def depthwise_geometry(geometry: ConvGeometry, config: KernelConfig = DEFAULT_CONFIG) -> ConvGeometry:
    """`geometry` with the depthwise forward's output tiles: row bands of up to config.depthwise_pixels."""
    return geometry.retiled(_row_band_tile(geometry.rows.out_size, geometry.cols.out_size, config.depthwise_pixels))


def _depthwise_block_c(x: torch.Tensor, tiled: ConvGeometry, config: KernelConfig) -> int:
    """Channels per depthwise program: as many as make ~config.depthwise_pixels outputs (1 on
    32x32 planes, 16 on 7x7), at least config.depthwise_block_c. Each is skipped on its own."""
    tile_pixels = tiled.rows.tile * tiled.cols.tile
    block_c = max(config.depthwise_block_c, next_pow2(max(1, config.depthwise_pixels // tile_pixels)))
    return min(block_c, next_pow2(x.shape[1]))


def sparse_depthwise_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, geometry: ConvGeometry,
    active: torch.Tensor, config: KernelConfig = DEFAULT_CONFIG,
) -> torch.Tensor:
    """Stage 2 for depthwise weights [C, 1, KH, KW], over the tiles of `geometry` with their
    `active` flags (from `depthwise_activity`)."""
    rows, cols = geometry.rows, geometry.cols
    y = _empty_output(x, geometry)
    weight = weight.contiguous()
    block_c = _depthwise_block_c(x, geometry, config)
    grid = (cdiv(geometry.in_channels, block_c), geometry.tiles, geometry.batch)
    # Not launched dependently: gdc_wait in each of its many short programs costs more than it saves.
    _sparse_depthwise_fwd_kernel[grid](
        x, weight, bias if bias is not None else weight, y, active,
        geometry.in_channels, rows.size, cols.size, rows.out_size, cols.out_size, cols.tiles,
        *x.stride(), *y.stride(), *conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        BLOCK_C=block_c, HAS_BIAS=bias is not None, num_warps=config.depthwise_num_warps,
        EVEN=rows.out_size % rows.tile == 0 and cols.out_size % cols.tile == 0,
        UNROLL=block_c * rows.kernel * cols.kernel <= DEPTHWISE_UNROLL_TAPS,
    )
    return y
