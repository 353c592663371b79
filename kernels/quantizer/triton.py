"""Triton kernels of the quantizer (reference.py), one pass each way, and their launchers.

Both treat x as a flat buffer (any dense layout: contiguous or channels_last). Forward: one program per BLOCK
elements, read x, write y. Backward: read x and grad, write grad_x and, when θ needs a gradient, θ's gradient:
a fixed grid of programs (BWD_PROGRAMS_PER_SM per multiprocessor) each walks blocks of BWD_BLOCK elements
BWD_BLOCK x programs apart and keeps one fp32 partial, and the partials are summed in the same launch in a fixed
order (kernels/partial_sums.py: deterministic for a given GPU). One partial per block instead made every program
wait on the count's fence, which cost more than the rest of the backward's work over its bytes (RESULTS.md).
Launches after the first for a key skip `JITFunction.run` (kernels/launch.py).
"""
import functools
from typing import Hashable

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.launch import Handle, launch
from kernels.native import spec as native_spec
from kernels.partial_sums import partials_and_counter, store_partial_and_total

BLOCK = 1024
NUM_WARPS = 4
BWD_BLOCK = 2048
BWD_NUM_WARPS = 4
BWD_PROGRAMS_PER_SM = 8  # 32 warps per multiprocessor: faster than 16 programs on an H100 (RESULTS.md)
CPU_BWD_PROGRAMS = 2  # under the interpreter: few, so that tests' shapes walk several blocks per program
_ALIGN = 16  # Triton specializes pointers on their alignment to this many bytes


@triton.jit
def _scaled(x, theta):
    """x / θ in fp32, IEEE-rounded as torch; zero lanes take x · (1/θ) (equal for every θ), since one zero
    lane sends a warp down the division's slow path (kernels/st_bif/triton.py)."""
    nonzero = x != 0
    return tl.where(nonzero, tl.math.div_rn(tl.where(nonzero, x, 1.0), theta), x * (1.0 / theta))


@triton.jit
def _quantize_fwd_kernel(x_ptr, y_ptr, theta_ptr, n, NEG_MIN: tl.constexpr, POS_MAX: tl.constexpr,
                         BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    theta = tl.load(theta_ptr).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    level = tl.floor(_scaled(x.to(tl.float32), theta) + 0.5)
    level = tl.minimum(tl.maximum(level, NEG_MIN), POS_MAX)
    tl.store(y_ptr + offs, (level * theta).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_bwd_kernel(x_ptr, grad_ptr, grad_x_ptr, theta_ptr, partials_ptr, counter_ptr, grad_theta_ptr, n,
                         theta_scale, NEG_MIN: tl.constexpr, POS_MAX: tl.constexpr, GRAD_THETA: tl.constexpr,
                         BLOCK: tl.constexpr):
    theta = tl.load(theta_ptr).to(tl.float32)
    stride = tl.num_programs(0).to(tl.int64) * BLOCK
    start = tl.program_id(0).to(tl.int64) * BLOCK
    acc = tl.zeros([BLOCK], tl.float32)
    while start < n:  # not range(): the interpreter cannot range over num_programs
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        grad = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = _scaled(x, theta)
        inside = (v >= NEG_MIN - 0.5) & (v < POS_MAX + 0.5)
        tl.store(grad_x_ptr + offs, tl.where(inside, grad, 0.0).to(grad_x_ptr.dtype.element_ty), mask=mask)
        if GRAD_THETA:
            level = tl.minimum(tl.maximum(tl.floor(v + 0.5), NEG_MIN), POS_MAX)
            acc += tl.where(mask, grad * tl.where(inside, level - v, level), 0.0)
        start += stride
    if GRAD_THETA:
        store_partial_and_total(partials_ptr, counter_ptr, grad_theta_ptr, tl.sum(acc, axis=0) * theta_scale)


_FWD_HANDLES: dict[Hashable, Handle] = {}
_BWD_HANDLES: dict[Hashable, Handle] = {}


def _num_programs(n: int, block: int = BLOCK) -> int:
    return -(-n // block)


def _device_index(x: Tensor) -> int | None:
    return x.get_device() if x.is_cuda else None


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _bwd_programs(n: int, device_index: int | None) -> int:
    """The backward's grid: BWD_PROGRAMS_PER_SM per multiprocessor (CPU_BWD_PROGRAMS on CPU), fewer if n is small."""
    cap = CPU_BWD_PROGRAMS if device_index is None else BWD_PROGRAMS_PER_SM * _multiprocessors(device_index)
    return min(_num_programs(n, BWD_BLOCK), cap)


def quantize_fwd(x: Tensor, theta: Tensor, neg_min: int, pos_max: int) -> Tensor:
    """y for a dense x (contiguous or channels_last); y has x's strides."""
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    device_index = _device_index(x)
    key = pointers = None
    if device_index is not None:
        pointers = (x.data_ptr(), y.data_ptr(), theta.data_ptr())
        key = (x.dtype, theta.dtype, n, neg_min, pos_max, *(p % _ALIGN for p in pointers))
    launch(_quantize_fwd_kernel, _FWD_HANDLES, key, device_index, _num_programs(n), (x, y, theta), pointers,
           (n, neg_min, pos_max, BLOCK), NUM_WARPS)
    return y


def quantize_bwd(
    grad: Tensor, x: Tensor, theta: Tensor, neg_min: int, pos_max: int, grad_theta: bool, theta_scale: float = 1.0
) -> tuple[Tensor, Tensor | None]:
    """(grad_x with x's strides, θ's gradient times ``theta_scale`` with θ's shape and dtype, or None); grad must
    have x's strides."""
    grad_x = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return grad_x, torch.zeros_like(theta) if grad_theta else None
    device_index = _device_index(x)
    num_programs = _bwd_programs(n, device_index)
    partials = counter = theta_grad = None
    if grad_theta:
        partials, counter = partials_and_counter(x.device, device_index, num_programs)
        theta_grad = torch.empty_like(theta)
    tensors = (x, grad, grad_x, theta, partials, counter, theta_grad)
    key = pointers = None
    if device_index is not None:
        pointers = tuple(None if t is None else t.data_ptr() for t in tensors)
        key = (x.dtype, grad.dtype, theta.dtype, n, neg_min, pos_max, grad_theta,
               *(None if p is None else p % _ALIGN for p in pointers))
    launch(_quantize_bwd_kernel, _BWD_HANDLES, key, device_index, num_programs, tensors, pointers,
           (n, float(theta_scale), neg_min, pos_max, grad_theta, BWD_BLOCK), BWD_NUM_WARPS)
    return grad_x, theta_grad


# The C++ autograd node (kernels/native) per kind of call, made once the Python path has launched both ways;
# UNAVAILABLE where it cannot be had.
_SPECS: dict[tuple, native_spec.NativeSpec | native_spec.Unavailable] = {}
_MAX_SPECS = 4096
_FWD_ROLES = native_spec.roles("x", "out", "theta")
_BWD_ROLES = native_spec.roles("x", "grad_out", "grad_x", "theta", "partials", "counter", "grad_theta")


def _usual_bwd_key(x: Tensor, theta: Tensor, neg_min: int, pos_max: int, grad_theta: bool) -> tuple:
    """quantize_bwd's launch key for aligned pointers and a gradient of x's dtype: what the node launches."""
    aligned = (0, 0, 0, 0, 0, 0, 0) if grad_theta else (0, 0, 0, 0, None, None, None)
    return (x.dtype, x.dtype, theta.dtype, x.numel(), neg_min, pos_max, grad_theta, *aligned)


def native_spec_for(x: Tensor, theta: Tensor, neg_min: int, pos_max: int, theta_scale: float
                    ) -> native_spec.NativeSpec | None:
    """The C++ node for quantize calls like this one (x's shape, strides, dtype and device, θ's shape and dtype,
    the bounds and the scale), or None: on CPU, while the node builds, and until the Python path has launched
    this kind's forward and one backward variant with aligned pointers."""
    if not x.is_cuda or not native_spec.available():
        return None
    if not (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)):
        return None  # the Python path copies x first: its kernels never saw x's strides
    key = (x.shape, x.stride(), x.dtype, x.device, theta.shape, theta.dtype, theta.device, neg_min, pos_max,
           float(theta_scale))
    spec = _SPECS.get(key)
    if spec is not None:
        return spec or None
    n = x.numel()
    fwd = _FWD_HANDLES.get((x.dtype, theta.dtype, n, neg_min, pos_max, 0, 0, 0))
    bwds = [_BWD_HANDLES.get(_usual_bwd_key(x, theta, neg_min, pos_max, grad_theta)) for grad_theta in (False, True)]
    if n == 0 or fwd is None or bwds == [None, None]:
        return None
    num_programs, bwd_programs = _num_programs(n), _bwd_programs(n, _device_index(x))

    def bwd_kernel(handle: Handle, grad_theta: bool) -> native_spec.NativeKernel:
        arguments = (0,) * 7 + (n, float(theta_scale), neg_min, pos_max, grad_theta, BWD_BLOCK)
        return native_spec.native_kernel(handle[3], bwd_programs, arguments, _BWD_ROLES)

    made: list[native_spec.NativeSpec] = []

    def python_backward(grad: Tensor, x: Tensor, theta: Tensor, grad_theta: bool) -> tuple[Tensor, Tensor | None]:
        if grad.stride() != x.stride():
            grad = torch.empty_like(x).copy_(grad)
        result = quantize_bwd(grad, x, theta, neg_min, pos_max, grad_theta, theta_scale)
        handle = _BWD_HANDLES.get(_usual_bwd_key(x, theta, neg_min, pos_max, grad_theta))
        if made and handle is not None and not made[0].has_backward[grad_theta]:  # a variant first launched now
            native_spec.set_backward(made[0], grad_theta, bwd_kernel(handle, grad_theta))
        return result

    try:
        forward = native_spec.native_kernel(fwd[3], num_programs, (0, 0, 0, n, neg_min, pos_max, BLOCK), _FWD_ROLES)
        spec = native_spec.new_spec(x, theta, bwd_programs, forward, python_backward)
        if spec is None:  # still building
            return None
        made.append(spec)
        for grad_theta, handle in zip((False, True), bwds):
            if handle is not None:
                native_spec.set_backward(spec, grad_theta, bwd_kernel(handle, grad_theta))
    except ValueError:
        spec = None
    if len(_SPECS) >= _MAX_SPECS:
        _SPECS.clear()
    _SPECS[key] = spec or native_spec.UNAVAILABLE
    return spec
