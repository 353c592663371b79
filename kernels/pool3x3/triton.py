"""Triton kernels of DARTS's 3x3 pools (padding 1, stride 1 or 2) on channels_last tensors, and their launchers.

Each program takes BLOCK consecutive elements of the NHWC output (forward) or input (backward). Forward: per output
element, the 9 taps in row-major order; the average divides by the window's pixels inside the image, the maximum
keeps the first largest tap (a NaN wins, as in PyTorch) and writes its tap index (int8) for the backward. Backward:
per input element, a gather over the ≤ 9 outputs whose window holds it, in ascending output order (PyTorch's order),
so no atomics. The channel count is a constant of each compiled kernel: its divisions become multiplications and a
pixel's channels are read as vectors.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.launch import Handle, launch

NUM_WARPS = 4


@triton.jit
def _window_pixels(o, STRIDE: tl.constexpr, size):
    """Pixels of the window of output row (or column) o inside [0, size)."""
    start = o * STRIDE - 1
    return tl.minimum(start + 2, size - 1) - tl.maximum(start, 0) + 1


@triton.jit
def _nhwc_index(e, H, W, C: tl.constexpr):
    """(n, h, w, c) of flat element e of an NHWC tensor [N, H, W, C]."""
    p = e // C
    return p // (W * H), (p // W) % H, p % W, e % C


@triton.jit
def _pool_fwd_kernel(x_ptr, y_ptr, idx_ptr, E, H, W, OH, OW, C: tl.constexpr, STRIDE: tl.constexpr, MAX: tl.constexpr,
                     BLOCK: tl.constexpr):
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # output elements, NHWC order
    mask = e < E
    n, oh, ow, c = _nhwc_index(e, OH, OW, C)
    h0, w0 = oh * STRIDE - 1, ow * STRIDE - 1
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    idx = tl.where(h0 < 0, 3, 0) + tl.where(w0 < 0, 1, 0)  # the window's first tap inside the image
    acc = tl.zeros([BLOCK], tl.float32)
    for kh in tl.static_range(3):
        for kw in tl.static_range(3):
            ih, iw = h0 + kh, w0 + kw
            inside = mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            v = tl.load(x_ptr + ((n * H + ih) * W + iw).to(tl.int64) * C + c, mask=inside, other=0.0).to(tl.float32)
            if MAX:
                take = inside & ((v > best) | (v != v))
                best = tl.where(take, v, best)
                idx = tl.where(take, kh * 3 + kw, idx)
            else:
                acc += v
    if MAX:
        tl.store(y_ptr + e, best.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(idx_ptr + e, idx.to(tl.int8), mask=mask)
    else:
        count = (_window_pixels(oh, STRIDE, H) * _window_pixels(ow, STRIDE, W)).to(tl.float32)
        tl.store(y_ptr + e, (acc / count).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pool_bwd_kernel(g_ptr, idx_ptr, gx_ptr, E, H, W, OH, OW, C: tl.constexpr, STRIDE: tl.constexpr, MAX: tl.constexpr,
                     BLOCK: tl.constexpr):
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # input elements, NHWC order
    mask = e < E
    n, h, w, c = _nhwc_index(e, H, W, C)
    acc = tl.zeros([BLOCK], tl.float32)
    for dh in tl.static_range(3):
        kh = 2 - dh  # ascending output rows
        th = h + 1 - kh  # = oh * STRIDE where (h, w) is tap (kh, kw) of output (oh, ow)
        oh = tl.maximum(th, 0) // STRIDE
        row_ok = (th >= 0) & (tl.maximum(th, 0) % STRIDE == 0) & (oh < OH)
        for dw in tl.static_range(3):
            kw = 2 - dw
            tw = w + 1 - kw
            ow = tl.maximum(tw, 0) // STRIDE
            ok = mask & row_ok & (tw >= 0) & (tl.maximum(tw, 0) % STRIDE == 0) & (ow < OW)
            at = ((n * OH + oh) * OW + ow).to(tl.int64) * C + c
            g = tl.load(g_ptr + at, mask=ok, other=0.0).to(tl.float32)
            if MAX:
                tap = tl.load(idx_ptr + at, mask=ok, other=-1).to(tl.int32)
                acc += tl.where(tap == kh * 3 + kw, g, 0.0)
            else:
                count = (_window_pixels(oh, STRIDE, H) * _window_pixels(ow, STRIDE, W)).to(tl.float32)
                acc += g / count
    tl.store(gx_ptr + e, acc.to(gx_ptr.dtype.element_ty), mask=mask)


# Elements per program and warps: tiles of pixels x all channels (padded to a power of two) were many times
# slower at the retrain's shapes (benchmarks/bench_pool3x3.py, in git history at 3b7d88c).
BLOCK, NUM_WARPS = 512, 4
MAX_ELEMENTS = 2**31 - 1  # the kernels index elements in int32


def output_size(size: int, stride: int) -> int:
    return (size - 1) // stride + 1  # kernel 3, padding 1


# Compiled launches kept by key (kernels/launch.py): later calls skip JITFunction.run's per-call binding.
_FWD_HANDLES: dict[tuple, Handle] = {}
_BWD_HANDLES: dict[tuple, Handle] = {}
_ALIGN = 16  # Triton specializes pointers on their alignment to this many bytes


def _launch(kernel, handles: dict, tensors: tuple, sizes: tuple, stride: int, maximum: bool) -> None:
    """kernel[grid](*tensors, *sizes, stride, maximum, BLOCK) on the tensors' device."""
    device = tensors[0].device
    device_index = device.index if device.type == "cuda" else None
    pointers = (tensors[0].data_ptr(), tensors[1].data_ptr(), tensors[2].data_ptr())
    # The key fixes every specialization: the sizes' values, the pointers' alignment, the dtypes.
    key = (tensors[0].dtype, tensors[1].dtype, tensors[2].dtype, sizes, stride, maximum,
           pointers[0] % _ALIGN, pointers[1] % _ALIGN, pointers[2] % _ALIGN)
    launch(kernel, handles, key, device_index, -(-sizes[0] // BLOCK), tensors, pointers,
           (*sizes, stride, maximum, BLOCK), NUM_WARPS)


def pool_fwd(x: Tensor, stride: int, maximum: bool) -> tuple[Tensor, Tensor | None]:
    """(y, tap index of each maximum or None) of a channels_last x [N, C, H, W]; y is channels_last."""
    n, c, h, w = x.shape
    oh, ow = output_size(h, stride), output_size(w, stride)
    y = torch.empty((n, c, oh, ow), device=x.device, dtype=x.dtype, memory_format=torch.channels_last)
    idx = torch.empty_like(y, dtype=torch.int8) if maximum else None
    if y.numel():
        _launch(_pool_fwd_kernel, _FWD_HANDLES, (x, y, idx if maximum else y), (y.numel(), h, w, oh, ow, c),
                stride, maximum)
    return y, idx


def pool_bwd(grad: Tensor, idx: Tensor | None, size: tuple[int, int], stride: int) -> Tensor:
    """The gradient of x (channels_last) from the channels_last gradient of y."""
    n, c, oh, ow = grad.shape
    h, w = size
    grad_x = torch.empty((n, c, h, w), device=grad.device, dtype=grad.dtype, memory_format=torch.channels_last)
    if grad_x.numel():
        _launch(_pool_bwd_kernel, _BWD_HANDLES, (grad, grad if idx is None else idx, grad_x),
                (grad_x.numel(), h, w, oh, ow, c), stride, idx is not None)
    return grad_x
