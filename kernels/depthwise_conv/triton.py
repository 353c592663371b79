"""Triton kernels of a depthwise conv (one K x K filter per channel, square stride, padding and dilation) on
channels_last tensors, and their launchers.

A program owns a tile of CHUNKS x BLOCK_P consecutive NHWC pixels by BLOCK_C channels, walked BLOCK_P pixels at a
time. Forward: per output pixel, the K x K taps in row-major order, summed in fp32. Backward: one pass per input
pixel gives both gradients. For tap t the output pixel o whose window puts t on input pixel i (i = o·S − P + t·D,
if such an o exists) sends grad_x[i] += g[o]·w[t] and grad_w[t] += g[o]·x[i]; every (o, t) pair that touches the
image is visited once, from its input pixel, and pairs on the padding add zero. So x and the output gradient are
read once (the K x K neighbours come from cache) and grad_x written once, where cuDNN's depthwise backward reads
them in two kernels. Each program keeps its K x K x BLOCK_C weight-gradient partial in registers across its chunks
and stores it once; the host sums the partials in program order (deterministic, no atomics). The channel count is a
constant of each compiled kernel: a pixel's channels then start on a known 8- or 16-byte boundary (36 or 72 fp16
channels), and the compiler loads and stores them as vectors instead of one element at a time.
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.launch import Handle, launch

MAX_ELEMENTS = 2**31 - 1  # the kernels index pixels and elements in int32 before widening


@triton.jit
def _depthwise_fwd_kernel(x_ptr, w_ptr, y_ptr, P_OUT, H, W, OH, OW, C: tl.constexpr, C_BLOCKS,
                          K: tl.constexpr, STRIDE: tl.constexpr, PAD: tl.constexpr, DIL: tl.constexpr,
                          CHUNKS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    c = (pid % C_BLOCKS) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    for chunk in range(CHUNKS):
        p = ((pid // C_BLOCKS) * CHUNKS + chunk) * BLOCK_P + tl.arange(0, BLOCK_P)  # output pixels, NHW order
        p_ok = p < P_OUT
        n, oh, ow = p // (OW * OH), (p // OW) % OH, p % OW
        acc = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
        for kh in tl.static_range(K):
            ih = oh * STRIDE - PAD + kh * DIL
            for kw in tl.static_range(K):
                iw = ow * STRIDE - PAD + kw * DIL
                inside = p_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                at = ((n * H + ih) * W + iw).to(tl.int64) * C
                v = tl.load(x_ptr + at[:, None] + c[None, :], mask=inside[:, None] & c_ok[None, :], other=0.0)
                tap = tl.load(w_ptr + (kh * K + kw) * C + c, mask=c_ok, other=0.0)
                acc += v.to(tl.float32) * tap.to(tl.float32)[None, :]
        out = p.to(tl.int64) * C
        tl.store(y_ptr + out[:, None] + c[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=p_ok[:, None] & c_ok[None, :])


@triton.jit
def _depthwise_bwd_kernel(x_ptr, g_ptr, w_ptr, gx_ptr, gw_ptr, P_IN, H, W, OH, OW, C: tl.constexpr, C_BLOCKS,
                          K: tl.constexpr, STRIDE: tl.constexpr, PAD: tl.constexpr, DIL: tl.constexpr,
                          CHUNKS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, TAPS: tl.constexpr):
    pid = tl.program_id(0)
    c = (pid % C_BLOCKS) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    rows = tl.arange(0, TAPS)[:, None]  # TAPS: K * K rounded up to a power of two
    gw = tl.zeros([TAPS, BLOCK_C], tl.float32)  # this program's weight-gradient partial, one row per tap
    for chunk in range(CHUNKS):
        p = ((pid // C_BLOCKS) * CHUNKS + chunk) * BLOCK_P + tl.arange(0, BLOCK_P)  # input pixels, NHW order
        p_ok = p < P_IN
        n, h, w = p // (W * H), (p // W) % H, p % W
        tile = p_ok[:, None] & c_ok[None, :]
        here = p.to(tl.int64)[:, None] * C + c[None, :]
        x = tl.load(x_ptr + here, mask=tile, other=0.0).to(tl.float32)
        gx = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
        for kh in tl.static_range(K):
            th = h + PAD - kh * DIL  # = oh * STRIDE where (h, w) is tap (kh, kw) of output pixel (oh, ow)
            oh = tl.maximum(th, 0) // STRIDE
            row_ok = p_ok & (th >= 0) & (tl.maximum(th, 0) % STRIDE == 0) & (oh < OH)
            for kw in tl.static_range(K):
                tw = w + PAD - kw * DIL
                ow = tl.maximum(tw, 0) // STRIDE
                ok = row_ok & (tw >= 0) & (tl.maximum(tw, 0) % STRIDE == 0) & (ow < OW)
                at = ((n * OH + oh) * OW + ow).to(tl.int64) * C
                g = tl.load(g_ptr + at[:, None] + c[None, :], mask=ok[:, None] & c_ok[None, :],
                            other=0.0).to(tl.float32)
                tap = tl.load(w_ptr + (kh * K + kw) * C + c, mask=c_ok, other=0.0).to(tl.float32)
                gx += g * tap[None, :]
                gw = tl.where(rows == kh * K + kw, gw + tl.sum(g * x, axis=0)[None, :], gw)
        tl.store(gx_ptr + here, gx.to(gx_ptr.dtype.element_ty), mask=tile)
    partial = ((pid // C_BLOCKS) * (K * K) + rows).to(tl.int64) * C + c[None, :]
    tl.store(gw_ptr + partial, gw, mask=(rows < K * K) & c_ok[None, :])


def output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def tile(channels: int, pixels: int) -> tuple[int, int, int]:
    """(BLOCK_P, BLOCK_C, CHUNKS): tiles of about 2,048 elements, channels padded to a power of two up to 64; up to
    16 chunks a program where there are pixels enough for several programs per SM, so the weight-gradient
    partials stay small beside the tensors."""
    block_c = min(64, triton.next_power_of_2(channels))
    block_p = 2048 // block_c
    chunks = 1
    while chunks < 16 and pixels >= block_p * chunks * 2 * 1024:
        chunks *= 2
    return block_p, block_c, chunks


NUM_WARPS = 4
_FWD_HANDLES: dict[tuple, Handle] = {}
_BWD_HANDLES: dict[tuple, Handle] = {}
_ALIGN = 16  # Triton specializes pointers on their alignment to this many bytes


def _launch(kernel, handles: dict, tensors: tuple, sizes: tuple, meta: tuple, programs: int) -> None:
    """kernel[(programs,)](*tensors, *sizes, *meta) on the tensors' device, kept by a key that fixes every
    specialization (dtypes, sizes, pointer alignment, the constexprs)."""
    device = tensors[0].device
    device_index = device.index if device.type == "cuda" else None
    pointers = tuple(t.data_ptr() for t in tensors)
    key = (*(t.dtype for t in tensors), sizes, meta, *(p % _ALIGN for p in pointers))
    launch(kernel, handles, key, device_index, programs, tensors, pointers, (*sizes, *meta), NUM_WARPS)


def _taps(weight: Tensor) -> Tensor:
    """The weight [C, 1, K, K] as [K * K, C]: a tap's channels contiguous."""
    c, _, k, _ = weight.shape
    return weight.reshape(c, k * k).t().contiguous()


def depthwise_fwd(x: Tensor, weight: Tensor, stride: int, padding: int, dilation: int) -> Tensor:
    """The channels_last output of the depthwise conv of a channels_last x [N, C, H, W] by weight [C, 1, K, K]."""
    n, c, h, w = x.shape
    k = weight.shape[-1]
    oh, ow = (output_size(s, k, stride, padding, dilation) for s in (h, w))
    y = torch.empty((n, c, oh, ow), device=x.device, dtype=x.dtype, memory_format=torch.channels_last)
    if y.numel():
        pixels = n * oh * ow
        block_p, block_c, chunks = tile(c, pixels)
        c_blocks = triton.cdiv(c, block_c)
        programs = triton.cdiv(pixels, block_p * chunks) * c_blocks
        _launch(_depthwise_fwd_kernel, _FWD_HANDLES, (x, _taps(weight), y), (pixels, h, w, oh, ow, c, c_blocks),
                (k, stride, padding, dilation, chunks, block_p, block_c), programs)
    return y


def depthwise_bwd(x: Tensor, weight: Tensor, grad: Tensor, stride: int, padding: int,
                  dilation: int) -> tuple[Tensor, Tensor]:
    """(grad_x channels_last, grad_weight [C, 1, K, K]) from channels_last x and output gradient, in one pass."""
    n, c, h, w = x.shape
    k = weight.shape[-1]
    oh, ow = grad.shape[2:]
    grad_x = torch.empty_like(x, memory_format=torch.channels_last)
    pixels = n * h * w
    if not pixels or not c:
        return grad_x.zero_(), torch.zeros_like(weight)
    block_p, block_c, chunks = tile(c, pixels)
    c_blocks = triton.cdiv(c, block_c)
    pixel_programs = triton.cdiv(pixels, block_p * chunks)
    partials = torch.empty((pixel_programs, k * k, c), device=x.device, dtype=torch.float32)
    _launch(_depthwise_bwd_kernel, _BWD_HANDLES, (x, grad, _taps(weight), grad_x, partials),
            (pixels, h, w, oh, ow, c, c_blocks),
            (k, stride, padding, dilation, chunks, block_p, block_c, triton.next_power_of_2(k * k)),
            pixel_programs * c_blocks)
    grad_w = partials.sum(0).t().reshape(c, 1, k, k)  # the programs' partials, summed in a fixed order
    return grad_x, grad_w.to(weight.dtype)
