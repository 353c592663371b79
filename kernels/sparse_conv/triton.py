"""Stage-2 Triton kernels of the spike-sparse convolution, their launchers, and the weight gradient.

Stage 1 (which channels are active where) is `prescan.py`, or the ST-BIF kernel's block map.
Stage 2, scatter-free: each program owns one output tile and reads only what touches it. Stride-1
dense calls take `packed.py`'s forward instead of `_sparse_conv_fwd_kernel`
(`uses_packed_forward`; KernelConfig.packed forces either).
  `_sparse_conv_fwd_kernel`  dense weights (groups=1), an implicit GEMM on tensor cores: a program
      owns BLOCK_P output pixels (whole rows where they fit: 4 x 32, 8 x 16, ...) x BLOCK_N output
      channels and, for each BLOCK_K active input channels of its list and each kernel tap,
      does acc[p, co] += X[p + shift(tap), ci] @ W[tap, ci, co] (tl.dot; fp16/bf16 in, fp32
      accumulate; fp32 in runs on TF32 tensor cores, cuDNN's default for fp32 convolutions too).
      The active channels are per (sample, output tile) when the layout keeps a channel's pixels
      together (NCHW: every X row is BLOCK_P-ish contiguous pixels, coalesced): the program ORs
      the block flags under its tile's window and compacts them into a list in registers, so
      stage 1 is the block map alone. When channels are innermost (channels_last) they are per
      sample: `_pack_active_planes_kernel` first copies the active planes into a dense
      [N, slots, H, W] buffer (one gathered pass over the active channels instead of one per
      tap), and the forward reads that buffer with its list. Weights are re-laid out per call to
      [KH, KW, C_in, C_out] in memory: gathering a channel's row gives a contiguous C_out vector.
  `_sparse_depthwise_fwd_kernel`  depthwise, channels_last, over row-band tiles: a program
      (BLOCK_C channels x one tile) whose channels are all silent there writes the bias, reading
      nothing. `_sparse_depthwise_planar_fwd_kernel` is its planar (NCHW) twin: whole-plane row
      bands, each silent channel of a program skipped on its own.
Weight gradients (input sparsity, a split reduction over (sample, 8x8 tile), no atomics):
  `_sparse_conv_wgrad_kernel`, `_sparse_depthwise_wgrad_kernel`.
Loops with a run-time bound are `while` loops (Triton 3.6's interpreter fails on range() with a
run-time bound, triton-lang/triton#9171); the forward's tap loop has a constant bound, so it is a
software-pipelined tl.range. All kernels take strides, so NCHW, channels_last and the flattened
[T*B, C, H, W] all work; the output takes the input's memory format. Batch offsets are int64.
The grid never depends on the data, so the path is CUDA-graph capturable.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from kernels.sparse_conv.geometry import BLOCK, ConvGeometry, cdiv, next_pow2
from kernels.sparse_conv.prescan import plane_lists, tile_activity, window_activity, window_bounds, window_flags
from kernels.sparse_conv.packed import pack_active_channels, packed_conv_fwd, packed_forward_available


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes; `benchmarks/bench_sparse_conv.py --sweep` times alternatives on the GPU."""

    forward_pixels: int = 128  # output pixels per forward program (the GEMM's M), a power of two
    forward_block_k: int = 16  # active input channels per tl.dot (its K): little padding when few are active
    forward_block_n: int = 128  # output channels per forward program (the GEMM's N)
    forward_num_warps: int = 4  # H200 sweep (RESULTS.md): 4 beat 8 on every input, 83 vs 122 µs at 90% silent
    forward_num_stages: int = 2  # software pipelining of the tap loop
    pack_pixels: int = 128  # pixels x slots per program of the channels_last packing
    pack_slots: int = 32
    depthwise_block_c: int = 32  # channels per depthwise program, channels_last
    depthwise_pixels: int = 128  # output pixels per depthwise program (row bands), channels_last
    # NCHW: row bands of up to 1024 pixels, and as many channels as make ~1024 outputs per program
    # (1 on 32x32 planes): a silent plane there is one program that only writes the bias (H100
    # sweep, RESULTS.md seventh run: 45-52 against 80-83 µs for 4 channels x 128 pixels)
    depthwise_planar_block_c: int = 1  # the fewest channels per planar program
    depthwise_planar_pixels: int = 1024
    depthwise_num_warps: int = 4
    wgrad_rows: int = 128  # rows of the weight-gradient tile: (tap, channel) pairs
    wgrad_block_n: int = 128
    wgrad_num_warps: int = 4
    packed: bool | None = None  # stride-1 dense forward on packed input (packed.py); None: wherever it applies
    packed_num_stages: int = 4  # H100 (RESULTS.md, sixth run): 3/4/5/6 stages 51.9/49.5/50.0/50.5 µs
    pack_active_pixels: int = 512  # pixels per program of packed.py's packing
    pack_active_num_warps: int = 2  # H100, three runs (RESULTS.md, sixth run): 2 warps 0.4-0.6 µs faster than 4


DEFAULT_CONFIG = KernelConfig()
_MAX_WGRAD_PARTIAL_BYTES = 8 << 20  # bound on the split reduction's scratch buffer
# The planar depthwise forward unrolls its channel loop up to this many channel x tap bodies. H100,
# [256, C, H, W] fp16 (RESULTS.md ninth run): unrolled, 4 channels x 25 taps compiled in 4.1 s
# and ran 14.3 µs against 18.4 looped; 16 x 25 took 32-39 s to compile and ran no faster
# (14.5 against 14.3 µs). Before this bound, those compiles were 161 of a fresh search's ~290 s.
DEPTHWISE_UNROLL_TAPS = 100


# Conv parameters stay run-time values: specializing on them (Triton does for ints equal to 1)
# would compile a variant per stride/padding/dilation combination without a faster kernel.
_CONV_ARGS = ["stride_h", "stride_w", "pad_h", "pad_w", "dil_h", "dil_w"]


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def interpreted() -> bool:
    """True when the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return isinstance(_sparse_conv_fwd_kernel, InterpretedFunction)


def _dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand type of tl.dot: the input's own. Triton 3.6's interpreter multiplies the raw bit
    patterns of bf16 operands, so there bf16 is widened to fp32 (exact products, fp32 sums)."""
    if dtype == torch.bfloat16 and interpreted():
        return tl.float32
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]


def _conv_args(geometry: ConvGeometry) -> tuple[int, ...]:
    rows, cols = geometry.rows, geometry.cols
    return (rows.stride, cols.stride, rows.padding, cols.padding, rows.dilation, cols.dilation)


def _empty_output(x: torch.Tensor, geometry: ConvGeometry) -> torch.Tensor:
    return torch.empty(geometry.output_shape, device=x.device, dtype=x.dtype, memory_format=_memory_format(x))


# ------------------------------------------------------------------------------ dense forward
@triton.jit
def _pack_active_planes_kernel(
    x_ptr, packed_ptr, index_ptr, count_ptr,
    channels, height, width, sx_n, sx_c, sx_h, sx_w,
    BLOCK_PIX: tl.constexpr, BLOCK_S: tl.constexpr,
):
    # packed[n, slot] = x[n, index[n, slot]] for slot < count[n]; later slots are left unset.
    # Samples go back to front: the prescan just read x front to back, its tail is still in L2.
    pix = tl.program_id(0) * BLOCK_PIX + tl.arange(0, BLOCK_PIX)
    n = tl.num_programs(1) - 1 - tl.program_id(1)
    plane = height * width
    pix_ok = pix < plane
    src = x_ptr + n.to(tl.int64) * sx_n + ((pix // width) * sx_h + (pix % width) * sx_w)[:, None]
    dst = packed_ptr + n.to(tl.int64) * channels * plane + pix[:, None]
    active_channels = tl.load(count_ptr + n)
    s0 = 0
    while s0 < active_channels:
        slot = s0 + tl.arange(0, BLOCK_S)
        s_ok = slot < active_channels
        ci = tl.load(index_ptr + n * channels + slot, mask=s_ok, other=0)
        mask = pix_ok[:, None] & s_ok[None, :]
        values = tl.load(src + ci[None, :] * sx_c, mask=mask, other=0.0)
        tl.store(dst + slot[None, :] * plane, values, mask=mask)
        s0 += BLOCK_S


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


@triton.jit(do_not_specialize=_CONV_ARGS)
def _sparse_conv_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, blocks_ptr, index_ptr, count_ptr,
    in_channels, out_channels, height, width, out_h, out_w, tiles_w, block_rows, block_cols,
    sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w, sw_o, sw_i, sw_h, sw_w,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
    PACKED: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_DTYPE: tl.constexpr,
    C_PAD: tl.constexpr, BLOCK: tl.constexpr, MAX_BLOCKS_H: tl.constexpr, MAX_BLOCKS_W: tl.constexpr,
):
    # Output-channel blocks vary fastest: programs of one tile run together and share its X in L2.
    # PACKED: x holds each sample's active channels densely, slot by slot, and index/count list
    # them (see _pack_active_planes_kernel). Else the program ORs the block map under its tile's
    # window itself and compacts the active channels in registers: no list kernel, no list buffer.
    co_block = tl.program_id(0)
    tile = tl.program_id(1)
    n = tl.num_programs(2) - 1 - tl.program_id(2)  # back to front: the prescan's last reads are in L2
    oh, ow, pix_ok = _tile_pixels(tile, tiles_w, out_h, out_w, TILE_H, TILE_W)
    offs_co = co_block * BLOCK_N + tl.arange(0, BLOCK_N)
    co_ok = offs_co < out_channels
    offs_k = tl.arange(0, BLOCK_K)
    x_base = x_ptr + n.to(tl.int64) * sx_n
    acc = tl.zeros((TILE_H * TILE_W, BLOCK_N), tl.float32)
    if PACKED:
        active_channels = tl.load(count_ptr + n)
    else:
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
        if PACKED:
            ci = tl.load(index_ptr + n * in_channels + slot, mask=k_ok, other=0)
            x_cols = x_base + slot[None, :] * sx_c
        else:
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


def channels_innermost(x: torch.Tensor) -> bool:
    """True for layouts where a pixel's channels lie together (channels_last): the forward then
    packs the active planes first instead of gathering channels per tap."""
    return x.shape[1] > 1 and x.stride(1) < x.stride(3)


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
    """What the dense forward iterates over: its output tiling, the block map, and for
    channels_last input the per-sample lists of active channels (`index` [N, C], `count` [N]);
    for other layouts the kernel derives each tile's list from the block map itself, and the
    packed forward's packing makes its lists as it packs."""

    geometry: ConvGeometry
    blocks: torch.Tensor
    index: torch.Tensor | None = None
    count: torch.Tensor | None = None
    packed: bool = False  # the packed forward: its packing (with the lists) runs inside sparse_conv_fwd

    @property
    def per_sample(self) -> bool:
        return self.count is not None


def forward_lists(x: torch.Tensor, blocks: torch.Tensor, geometry: ConvGeometry,
                  config: KernelConfig = DEFAULT_CONFIG) -> ForwardLists:
    """The dense forward's lists for input x with block map `blocks`."""
    tiled = forward_geometry(geometry, config)
    if uses_packed_forward(geometry, config):
        return ForwardLists(tiled, blocks, packed=True)
    if channels_innermost(x):
        return ForwardLists(tiled, blocks, *plane_lists(blocks))
    return ForwardLists(tiled, blocks)


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
    for channels_last and the packed forward, [N, tiles] otherwise); a measurement for the
    dispatcher and the tests."""
    if lists.packed:
        return plane_lists(lists.blocks)[1]
    return lists.count if lists.per_sample else tile_activity(lists.blocks, lists.geometry)[2]


def pack_active_planes(x: torch.Tensor, lists: ForwardLists, config: KernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """[N, C, H, W] contiguous whose first count[n] channels of sample n are x's listed planes."""
    batch, channels, height, width = x.shape
    packed = torch.empty((batch, channels, height, width), device=x.device, dtype=x.dtype)
    _pack_active_planes_kernel[(cdiv(height * width, config.pack_pixels), batch)](
        x, packed, lists.index, lists.count, channels, height, width, *x.stride(),
        BLOCK_PIX=config.pack_pixels, BLOCK_S=config.pack_slots,
    )
    return packed


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
    # tap is then a contiguous C_out vector. Reading the [C_out, C_in, KH, KW] layout in place by
    # its strides saves the copy but made the kernel 1.3x slower (H100 sweep, RESULTS.md). The
    # packed path's packing kernel makes the copy; the other path runs a copy kernel.
    if lists.packed:
        packed, index, count, weight_rows = pack_active_channels(
            x, lists.blocks, weight, config.pack_active_pixels, config.pack_active_num_warps)
        return packed_conv_fwd(packed, index, count, weight_rows, bias, y, geometry, block_n=block_n,
                               num_stages=config.packed_num_stages, num_warps=config.forward_num_warps,
                               dot_dtype=_dot_dtype(x.dtype))
    weight = weight.permute(2, 3, 1, 0).contiguous().permute(3, 2, 0, 1)
    source = pack_active_planes(x, lists, config) if lists.per_sample else x
    grid = (cdiv(geometry.out_channels, block_n), geometry.tiles, geometry.batch)
    blocks = lists.blocks
    _sparse_conv_fwd_kernel[grid](
        source, weight, bias if bias is not None else weight, y, blocks,
        lists.index if lists.per_sample else blocks, lists.count if lists.per_sample else blocks,
        geometry.in_channels, geometry.out_channels, rows.size, cols.size, rows.out_size, cols.out_size,
        cols.tiles, blocks.shape[1], blocks.shape[2], *source.stride(), *y.stride(), *weight.stride(),
        *_conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        BLOCK_K=config.forward_block_k, BLOCK_N=block_n, NUM_STAGES=config.forward_num_stages,
        PACKED=lists.per_sample, HAS_BIAS=bias is not None, DOT_DTYPE=_dot_dtype(x.dtype),
        C_PAD=next_pow2(geometry.in_channels), BLOCK=BLOCK,
        MAX_BLOCKS_H=rows.max_blocks_per_tile, MAX_BLOCKS_W=cols.max_blocks_per_tile,
        num_warps=config.forward_num_warps,
    )
    return y


# ---------------------------------------------------------------------------------- depthwise
@triton.jit(do_not_specialize=_CONV_ARGS)
def _sparse_depthwise_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, active_ptr,
    channels, height, width, out_h, out_w, tiles_w,
    sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    # channels_last. A program whose channels are all silent over its tile's window writes the bias
    # and reads no input. Otherwise its loads are masked by the image bounds only (a silent channel
    # reads as the zeros it is), which keeps them vectorizable along channels.
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    tile = tl.program_id(1)
    n = tl.program_id(2)
    pair = n * tl.num_programs(1) + tile
    c_ok = offs_c < channels
    flags = tl.load(active_ptr + pair * channels + offs_c, mask=c_ok, other=0)
    oh, ow, pix_ok = _tile_pixels(tile, tiles_w, out_h, out_w, TILE_H, TILE_W)
    x_base = x_ptr + n.to(tl.int64) * sx_n + offs_c[None, :] * sx_c
    acc = tl.zeros((TILE_H * TILE_W, BLOCK_C), tl.float32)
    if tl.max(flags.to(tl.int32), axis=0) > 0:
        for kh in tl.static_range(KH):
            ih = oh * stride_h - pad_h + kh * dil_h
            row_ok = pix_ok & (ih >= 0) & (ih < height)
            for kw in tl.static_range(KW):
                iw = ow * stride_w - pad_w + kw * dil_w
                ok = (row_ok & (iw >= 0) & (iw < width))[:, None] & c_ok[None, :]
                xv = tl.load(x_base + (ih * sx_h + iw * sx_w)[:, None], mask=ok, other=0.0)
                wv = tl.load(w_ptr + offs_c * (KH * KW) + kh * KW + kw, mask=c_ok, other=0.0)
                acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + n.to(tl.int64) * sy_n + offs_c[None, :] * sy_c + (oh * sy_h + ow * sy_w)[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=pix_ok[:, None] & c_ok[None, :],
             eviction_policy="evict_first")


@triton.jit
def _planar_channel(x_ptr, w_ptr, bias_ptr, y_ptr, active_ptr, c, n, pair, oh, ow, pix_ok,
                    channels, height, width, sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
                    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                    KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr):
    """Channel c of a planar program's row band: its KH x KW taps unless the channel is silent
    over the band's window (then only the bias is written)."""
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


# Conv parameters are specialized here (unlike _CONV_ARGS elsewhere): with stride, padding and
# dilation of 1 known at compile time this kernel took 36.2 instead of 52.7 µs (H100, RESULTS.md
# seventh run), for a few more compiles. The channel loop is unrolled only for short bodies
# (UNROLL, up to DEPTHWISE_UNROLL_TAPS): unrolled, 16 channels x 25 taps took 32-39 s to compile.
@triton.jit
def _sparse_depthwise_planar_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr, active_ptr,
    channels, height, width, out_h, out_w, tiles_w,
    sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
    KH: tl.constexpr, KW: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr,
    BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, UNROLL: tl.constexpr,
):
    # Planar layouts (pixels contiguous): the program's channels one after the other, each a 1-D
    # row band. EVEN (tiles cover the output exactly) drops the store mask (not timed on its own).
    tile = tl.program_id(1)
    n = tl.program_id(2)
    pair = n * tl.num_programs(1) + tile
    oh, ow, pix_ok = _tile_pixels(tile, tiles_w, out_h, out_w, TILE_H, TILE_W)
    if UNROLL:
        for j in tl.static_range(BLOCK_C):
            _planar_channel(x_ptr, w_ptr, bias_ptr, y_ptr, active_ptr, tl.program_id(0) * BLOCK_C + j, n, pair,
                            oh, ow, pix_ok, channels, height, width, sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
                            stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, KH, KW, HAS_BIAS, EVEN)
    else:
        for j in range(BLOCK_C):
            _planar_channel(x_ptr, w_ptr, bias_ptr, y_ptr, active_ptr, tl.program_id(0) * BLOCK_C + j, n, pair,
                            oh, ow, pix_ok, channels, height, width, sx_n, sx_c, sx_h, sx_w, sy_n, sy_c, sy_h, sy_w,
                            stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, KH, KW, HAS_BIAS, EVEN)


def depthwise_activity(x: torch.Tensor, blocks: torch.Tensor, geometry: ConvGeometry,
                       config: KernelConfig = DEFAULT_CONFIG, *, planes: torch.Tensor | None = None,
                       ) -> tuple[ConvGeometry, torch.Tensor]:
    """The depthwise forward's tiling of x (row bands, their size by x's layout) and its `active`
    flags [N, tiles, C]. Where one tile covers the whole output plane, the plane flags [N, C]
    (if the ST-BIF kernel wrote them) are those flags as they are: the tile's window lies within
    the plane, so a silent plane is a silent window. Else the block map's windows are ORed."""
    tiled = depthwise_geometry(geometry, not channels_innermost(x), config)
    if planes is not None and tiled.tiles == 1:
        return tiled, planes.unsqueeze(1)
    return tiled, window_activity(blocks, tiled)


@functools.lru_cache(maxsize=4096)
def depthwise_geometry(geometry: ConvGeometry, planar: bool, config: KernelConfig = DEFAULT_CONFIG) -> ConvGeometry:
    """`geometry` with the depthwise forward's output tiles: row bands of up to
    config.depthwise_planar_pixels (planar input) or config.depthwise_pixels (channels_last)."""
    pixels = config.depthwise_planar_pixels if planar else config.depthwise_pixels
    return geometry.retiled(_row_band_tile(geometry.rows.out_size, geometry.cols.out_size, pixels))


def _depthwise_block_c(x: torch.Tensor, tiled: ConvGeometry, config: KernelConfig) -> int:
    """Channels per depthwise program. channels_last: many (vector loads along channels); a
    program is skipped only if all of them are silent. Planar: each channel is skipped on its own,
    so as many as make a program of ~depthwise_planar_pixels outputs (1 on 32x32 planes, 16 on
    7x7), at least depthwise_planar_block_c."""
    if channels_innermost(x):
        block_c = config.depthwise_block_c
    else:
        tile_pixels = tiled.rows.tile * tiled.cols.tile
        block_c = max(config.depthwise_planar_block_c, next_pow2(max(1, config.depthwise_planar_pixels // tile_pixels)))
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
    planar = not channels_innermost(x)
    planar_args = {"EVEN": rows.out_size % rows.tile == 0 and cols.out_size % cols.tile == 0,
                   "UNROLL": block_c * rows.kernel * cols.kernel <= DEPTHWISE_UNROLL_TAPS} if planar else {}
    kernel = _sparse_depthwise_planar_fwd_kernel if planar else _sparse_depthwise_fwd_kernel
    kernel[grid](
        x, weight, bias if bias is not None else weight, y, active,
        geometry.in_channels, rows.size, cols.size, rows.out_size, cols.out_size, cols.tiles,
        *x.stride(), *y.stride(), *_conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        BLOCK_C=block_c, HAS_BIAS=bias is not None, num_warps=config.depthwise_num_warps, **planar_args,
    )
    # Not launched dependently: gdc_wait in each of its many short programs cost more than it
    # saved (H100, [256,128,32,32] planar: 45.2 against 35.9 µs; RESULTS.md eighth run).
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
    chunk = _wgrad_chunk(geometry, config)
    block_n = min(config.wgrad_block_n, max(16, next_pow2(c_out)))
    programs = cdiv(c_in, chunk) * cdiv(c_out, block_n)
    pairs = geometry.batch * geometry.tiles
    splits = _split_count(x, programs, pairs, taps * c_in * c_out * 4)
    partial = torch.empty((splits, taps, c_in, c_out), device=x.device, dtype=torch.float32)
    _sparse_conv_wgrad_kernel[(programs, splits)](
        x, grad_y, active, partial,
        c_in, c_out, rows.size, cols.size, rows.out_size, cols.out_size, geometry.tiles, cols.tiles, pairs,
        *x.stride(), *grad_y.stride(), *_conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        CHUNK_C=chunk, TAPS_PAD=next_pow2(taps), BLOCK_N=block_n,
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
    block_c = min(config.depthwise_block_c, next_pow2(channels))
    programs = cdiv(channels, block_c)
    pairs = geometry.batch * geometry.tiles
    splits = _split_count(x, programs, pairs, taps * channels * 4)
    partial = torch.empty((splits, taps, channels), device=x.device, dtype=torch.float32)
    _sparse_depthwise_wgrad_kernel[(programs, splits)](
        x, grad_y, active, partial,
        channels, rows.size, cols.size, rows.out_size, cols.out_size, geometry.tiles, cols.tiles, pairs,
        *x.stride(), *grad_y.stride(), *_conv_args(geometry),
        KH=rows.kernel, KW=cols.kernel, TILE_H=rows.tile, TILE_W=cols.tile,
        TAPS_PAD=next_pow2(taps), BLOCK_C=block_c, num_warps=config.depthwise_num_warps,
    )
    grad_w = partial.sum(dim=0).view(rows.kernel, cols.kernel, channels).permute(2, 0, 1).unsqueeze(1)
    return grad_w.to(weight_dtype).contiguous()


# ------------------------------------------------------------------------ dispatcher's measure
def _any_per_chunk(active: torch.Tensor, chunk: int) -> torch.Tensor:
    """Fraction of the (sample, tile, chunk of `chunk` channels) groups of `active` [N, tiles, C]
    with any active channel."""
    padded = torch.nn.functional.pad(active, (0, -active.shape[2] % chunk))
    return padded.view(*active.shape[:2], -1, chunk).amax(dim=3).float().mean()


def work_fractions(x: torch.Tensor, blocks: torch.Tensor, geometry: ConvGeometry,
                   config: KernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """float32 [2] on the device: the fraction of the dense work that the forward and the
    weight-gradient kernels do on input x with block map `blocks` (what their run time is
    linear in). `geometry` has the 8x8 tiles of the weight-gradient kernels."""
    wgrad_chunk = _wgrad_chunk(geometry, config)
    wgrad = _any_per_chunk(tile_activity(blocks, geometry)[0], wgrad_chunk)
    if geometry.is_depthwise:
        # Planar: each silent channel is skipped on its own; channels_last: whole programs only.
        tiled, active = depthwise_activity(x, blocks, geometry, config)
        forward = _any_per_chunk(active, _depthwise_block_c(x, tiled, config) if channels_innermost(x) else 1)
    else:
        count = forward_counts(x, forward_lists(x, blocks, geometry, config))
        block_k = config.forward_block_k
        forward = torch.div(count + block_k - 1, block_k, rounding_mode="floor").float().mean()
        forward = forward / cdiv(geometry.in_channels, block_k)
    return torch.stack([forward, wgrad])
