"""Launching the ST-BIF kernels (triton.py): `st_bif_fwd` and `st_bif_bwd`, checked, and `forward` and
`backward`, their unchecked launchers for an input of a known kind.

Launches go through a Plan made once per kind of input (shape, strides, dtype, device, bounds), which also
sets up the eager neurons' C++ node (kernels/native) from the first launches it can take over.
"""
import os
from typing import Hashable, NamedTuple

import torch
from torch import Tensor

from kernels.block_map import BlockMap
from kernels.dependent_launch import use_pdl
from kernels.launch import Handle, launch
from kernels.native import spec as native_spec
from kernels.partial_sums import partials_and_counter

from .surrogates import get_surrogate
from .triton import _st_bif_bwd_kernel, _st_bif_fwd_kernel

MAP_BLOCK = 8  # side of a block of the sparse conv's block map (kernels.sparse_conv.geometry.BLOCK)
# Steps kept in registers at once: bounds register use for long sequences.
_MAX_CHUNK = 8
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_triton_input(x_seq: Tensor) -> None:
    if x_seq.dtype not in _TRITON_DTYPES:
        raise ValueError(
            f"the Triton ST-BIF kernels take float16/bfloat16/float32, got {x_seq.dtype}; "
            "use backend='torch' or cast the input"
        )
    if not x_seq.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"backend 'triton' got a tensor on {x_seq.device}: move it to CUDA, use "
            "backend='torch', or set TRITON_INTERPRET=1 before importing triton"
        )


def _chunk(num_steps: int) -> int:
    return min(num_steps, _MAX_CHUNK)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a constexpr_function: a wrapper call per use on the host


class LaunchConfig(NamedTuple):
    block: int  # neurons per program
    num_warps: int = 4


# The more steps a chunk keeps in registers, the fewer neurons per thread; the backward keeps
# ~3 values per step, the forward 1, so the backward takes half the block.
def fwd_config(num_steps: int) -> LaunchConfig:
    return LaunchConfig(block=1024 if _chunk(num_steps) <= 4 else 512)


def bwd_config(num_steps: int) -> LaunchConfig:
    return LaunchConfig(block=512 if _chunk(num_steps) <= 4 else 256)


def can_write_block_map(x_seq: Tensor) -> bool:
    """Whether the forward kernel can write a block map for x_seq: [T, B, C, H, W], and int32
    neuron indices (fewer than 2**31 neurons per step)."""
    return x_seq.dim() == 5 and x_seq[0].numel() < 2**31


MapShapes = tuple[int, tuple[int, int, int, int], tuple[int, int]]  # (number of blocks, blocks' shape, planes' shape)


def _map_shapes(x_seq: Tensor) -> MapShapes:
    steps, batch, channels, height, width = x_seq.shape
    shape = (steps * batch, _cdiv(height, MAP_BLOCK), _cdiv(width, MAP_BLOCK), channels)
    return shape[0] * shape[1] * shape[2] * channels, shape, (steps * batch, channels)


def _view_strides(t: Tensor, num_steps: int) -> tuple[int, int] | None:
    """t's strides as [T, N] where that is a view (the kernels then take t itself), else None."""
    try:
        return t.view(num_steps, -1).stride()
    except RuntimeError:
        return None


class Plan:
    """What launches on one kind of sequence need, worked out once per kind: x_seq's shape,
    strides, dtype and device, the bounds, the surrogate and the launch configurations. It also
    keeps both kernels' compiled launches (kernels/launch.py), keyed by what may still vary per call."""

    __slots__ = ("num_steps", "chunk", "n", "x_strides", "device_index", "pos_max", "neg_min", "fwd", "bwd",
                 "surrogate", "alpha", "map_dims", "map_shapes", "grad_strides", "fwd_handles", "bwd_handles", "native")

    def __init__(self, x_seq: Tensor, pos_max: int, neg_min: int, surrogate: str,
                 fwd_cfg: LaunchConfig | None = None, bwd_cfg: LaunchConfig | None = None) -> None:
        _check_triton_input(x_seq)
        sg = get_surrogate(surrogate)
        self.num_steps = num_steps = x_seq.shape[0]
        self.chunk = _chunk(num_steps)
        self.n = x_seq[0].numel()
        self.x_strides = _view_strides(x_seq, num_steps)
        self.device_index = x_seq.get_device() if x_seq.is_cuda else None
        self.pos_max, self.neg_min = pos_max, neg_min
        fwd_block, fwd_warps = fwd_cfg or fwd_config(num_steps)
        bwd_block, bwd_warps = bwd_cfg or bwd_config(num_steps)
        self.fwd = (fwd_block, fwd_warps, _cdiv(self.n, fwd_block))
        self.bwd = (bwd_block, bwd_warps, _cdiv(self.n, bwd_block))
        self.surrogate, self.alpha = sg.name, sg.alpha
        writes_map = can_write_block_map(x_seq)
        self.map_dims = tuple(x_seq.shape[2:]) if writes_map else None
        self.map_shapes = _map_shapes(x_seq) if writes_map else None
        self.grad_strides: dict[tuple[int, ...], tuple[int, int] | None] = {}  # per layout of grad_out
        self.fwd_handles: dict[Hashable, Handle] = {}
        self.bwd_handles: dict[Hashable, Handle] = {}
        # The C++ node (kernels/native): for contiguous CUDA input, set up once the Python path has launched.
        self.native: native_spec.NativeSpec | native_spec.Unavailable | None = (
            None if self.device_index is not None and x_seq.is_contiguous() else native_spec.UNAVAILABLE)


# Triton specializes pointers on their alignment to this many bytes: part of a compiled launch's key.
_ALIGN = 16
_PLANS: dict[tuple, Plan] = {}
_MAX_PLANS = 4096  # far more kinds than a network has layers times batch sizes; bounds a leak


def get_plan(
    x_seq: Tensor, pos_max: int, neg_min: int, surrogate: str = "sigmoid",
    fwd_cfg: LaunchConfig | None = None, bwd_cfg: LaunchConfig | None = None,
) -> Plan:
    """The Plan of x_seq's kind, made on first use (ValueError for a dtype or device the kernels
    do not take, or an unknown surrogate)."""
    key = (x_seq.shape, x_seq.stride(), x_seq.dtype, x_seq.device, pos_max, neg_min, surrogate, fwd_cfg, bwd_cfg)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = Plan(x_seq, pos_max, neg_min, surrogate, fwd_cfg, bwd_cfg)
    return plan


def new_block_map(x_seq: Tensor) -> BlockMap:
    """The zeroed block map that `st_bif_fwd(..., block_map=)` fills, for x_seq [T, B, C, H, W]:
    its blocks and plane flags share one allocation, so one memset zeroes both."""
    if not can_write_block_map(x_seq):
        raise ValueError(f"a block map needs a [T, B, C, H, W] sequence of fewer than 2**31 neurons per step, "
                         f"got shape {tuple(x_seq.shape)}")
    return block_map_of(_map_shapes(x_seq), x_seq)


def block_map_of(map_shapes: MapShapes, x_seq: Tensor) -> BlockMap:
    """`new_block_map` for shapes already worked out (a Plan's `map_shapes`)."""
    blocks, shape, planes_shape = map_shapes
    buffer = torch.zeros(blocks + planes_shape[0] * planes_shape[1], dtype=torch.int8, device=x_seq.device)
    return BlockMap(buffer[:blocks].view(shape), buffer[blocks:].view(planes_shape))


def forward(
    plan: Plan, x_seq: Tensor, q_threshold: Tensor, with_state: bool = False, block_map: BlockMap | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """`st_bif_fwd` for an x_seq of the plan's kind, without checks."""
    out = torch.empty_like(x_seq, memory_format=torch.contiguous_format)
    q_final = acc_final = None
    if with_state:
        q_final = torch.empty(x_seq.shape[1:], dtype=torch.float32, device=x_seq.device)
        acc_final = torch.empty_like(q_final)
    if plan.n == 0:
        return out, q_final, acc_final
    if plan.x_strides is None:  # a copy, contiguous: the same strides every call
        x_seq = x_seq.reshape(plan.num_steps, -1)
        stride_t, stride_n = x_seq.stride()
    else:
        stride_t, stride_n = plan.x_strides
    block, num_warps, num_programs = plan.fwd
    if block_map is None:
        blocks = planes = None
        channels = height = width = 1  # variants with a map are compiled per plane shape; others share one
        pdl = False
    else:
        blocks, planes = block_map
        channels, height, width = plan.map_dims
        pdl = use_pdl(x_seq)  # the map's reader, the conv, follows
    tensors = (x_seq, out, q_final, acc_final, q_threshold, blocks, planes)
    scalars = (plan.n, stride_t, stride_n, plan.pos_max, plan.neg_min, plan.num_steps, plan.chunk, block,
               with_state, blocks is not None, MAP_BLOCK, channels, height, width, pdl)
    key = pointers = None
    if plan.device_index is not None:  # what fixes Triton's specialization beyond the plan (see _ALIGN)
        x_ptr, out_ptr, theta_ptr = x_seq.data_ptr(), out.data_ptr(), q_threshold.data_ptr()
        q_ptr = acc_ptr = blocks_ptr = planes_ptr = None
        key = (x_ptr % _ALIGN, out_ptr % _ALIGN, q_threshold.dtype, theta_ptr % _ALIGN, with_state,
               blocks is not None, pdl)
        if with_state:
            q_ptr, acc_ptr = q_final.data_ptr(), acc_final.data_ptr()
            key += (q_ptr % _ALIGN, acc_ptr % _ALIGN)
        if blocks is not None:
            blocks_ptr, planes_ptr = blocks.data_ptr(), planes.data_ptr()
            key += (blocks_ptr % _ALIGN, planes_ptr % _ALIGN)
        pointers = (x_ptr, out_ptr, q_ptr, acc_ptr, theta_ptr, blocks_ptr, planes_ptr)
    launch(_st_bif_fwd_kernel, plan.fwd_handles, key, plan.device_index, num_programs, tensors, pointers, scalars,
           num_warps, pdl)
    if plan.native is None and key == (0, 0, q_threshold.dtype, 0, False, False, False):
        _offer_forward(plan, key, x_seq, q_threshold, (*pointers, *scalars))
    return out, q_final, acc_final


def backward(
    plan: Plan, grad_out: Tensor, x_seq: Tensor, q_threshold: Tensor, grad_threshold: bool,
) -> tuple[Tensor, Tensor | None]:
    """`st_bif_bwd` for an x_seq of the plan's kind and a grad_out of its shape, without checks
    (grad θ None unless grad_threshold)."""
    grad_x = torch.empty_like(x_seq, memory_format=torch.contiguous_format)
    block, num_warps, num_programs = plan.bwd
    if plan.n == 0:
        return grad_x, torch.zeros_like(q_threshold) if grad_threshold else None
    partials = counter = grad_theta = None
    if grad_threshold:  # the kernel sums its per-program partials into grad θ (kernels/partial_sums.py)
        partials, counter = partials_and_counter(x_seq.device, plan.device_index, num_programs)
        grad_theta = torch.empty_like(q_threshold)
    if plan.x_strides is None:
        x_seq = x_seq.reshape(plan.num_steps, -1)
        x_stride_t, x_stride_n = x_seq.stride()
    else:
        x_stride_t, x_stride_n = plan.x_strides
    layout = grad_out.stride()  # e.g. contiguous, or all 0 for the gradient of a sum
    g_strides = plan.grad_strides.get(layout, False)
    if g_strides is False:
        g_strides = plan.grad_strides[layout] = _view_strides(grad_out, plan.num_steps)
    if g_strides is None:
        grad_out = grad_out.reshape(plan.num_steps, -1)
        g_strides = grad_out.stride()
    tensors = (x_seq, grad_out, grad_x, q_threshold, partials, counter, grad_theta)
    scalars = (plan.n, x_stride_t, x_stride_n, *g_strides, plan.pos_max, plan.neg_min, plan.num_steps, plan.chunk,
               block, plan.surrogate, plan.alpha, grad_threshold)
    key = pointers = None
    if plan.device_index is not None:
        x_ptr, g_ptr, gx_ptr = x_seq.data_ptr(), grad_out.data_ptr(), grad_x.data_ptr()
        theta_ptr = q_threshold.data_ptr()
        key = (x_ptr % _ALIGN, grad_out.dtype, g_ptr % _ALIGN, g_strides, gx_ptr % _ALIGN, q_threshold.dtype,
               theta_ptr % _ALIGN, grad_threshold)
        if grad_threshold:
            partials_ptr, counter_ptr, grad_theta_ptr = partials.data_ptr(), counter.data_ptr(), grad_theta.data_ptr()
            key += (partials_ptr % _ALIGN, counter_ptr % _ALIGN, grad_theta_ptr % _ALIGN)
        else:
            partials_ptr = counter_ptr = grad_theta_ptr = None
        pointers = (x_ptr, g_ptr, gx_ptr, theta_ptr, partials_ptr, counter_ptr, grad_theta_ptr)
    launch(_st_bif_bwd_kernel, plan.bwd_handles, key, plan.device_index, num_programs, tensors, pointers, scalars,
           num_warps)
    native = plan.native
    if native and not native.has_backward[grad_threshold] and key == _usual_backward_key(plan, native, grad_threshold):
        native_spec.set_backward(native, grad_threshold, native_spec.native_kernel(
            plan.bwd_handles[key][3], num_programs, (*pointers, *scalars), _BWD_ROLES))
    return grad_x, grad_theta


# The kernels' leading pointer arguments, by role in the C++ node (None: passed as None there).
_FWD_ROLES = native_spec.roles("x", "out", None, None, "theta", None, None)
_BWD_ROLES = native_spec.roles("x", "grad_out", "grad_x", "theta", "partials", "counter", "grad_theta")


def _offer_forward(plan: Plan, key: tuple, x_seq: Tensor, q_threshold: Tensor, arguments: tuple) -> None:
    """Sets up the plan's C++ node from the forward just launched, for aligned contiguous input (the key);
    leaves plan.native None while the node builds, UNAVAILABLE where it cannot be had."""
    if not native_spec.available():
        plan.native = native_spec.UNAVAILABLE
        return
    try:
        kernel = native_spec.native_kernel(plan.fwd_handles[key][3], plan.fwd[2], arguments, _FWD_ROLES)
    except ValueError:
        plan.native = native_spec.UNAVAILABLE
        return
    spec = native_spec.new_spec(x_seq, q_threshold, plan.bwd[2], kernel,
                                lambda grad_out, x, theta, grad_threshold: backward(plan, grad_out, x, theta,
                                                                                    grad_threshold))
    if spec is not None:
        plan.native = spec


def _usual_backward_key(plan: Plan, native: native_spec.NativeSpec, grad_threshold: bool) -> tuple:
    """The backward's launch key for what the C++ node launches itself: aligned contiguous tensors."""
    key = (0, native.x_dtype, 0, (plan.n, 1), 0, native.theta_dtype, 0, grad_threshold)
    return key + (0, 0, 0) if grad_threshold else key


def st_bif_fwd(
    x_seq: Tensor,
    q_threshold: Tensor,
    pos_max: int,
    neg_min: int,
    *,
    with_state: bool = False,
    config: LaunchConfig | None = None,
    block_map: BlockMap | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Forward over x_seq [T, ...]; returns (out, q_T, acc_T), the states only if with_state.

    `block_map` (for x_seq [T, B, C, H, W], zeroed, from `new_block_map`) gets a 1 wherever an
    8x8 block of a (step, sample, channel) plane spikes, and in its plane flags wherever the
    plane spikes: the spike-sparse convolution's map (kernels/block_map.py), so that it need not
    read the output to make it.
    """
    plan = get_plan(x_seq, pos_max, neg_min, fwd_cfg=config)
    if block_map is not None and plan.map_dims is None:
        raise ValueError(f"a block map needs a [T, B, C, H, W] sequence of fewer than 2**31 neurons per step, "
                         f"got shape {tuple(x_seq.shape)}")
    return forward(plan, x_seq, q_threshold, with_state, block_map)


def st_bif_bwd(
    grad_out: Tensor,
    x_seq: Tensor,
    q_threshold: Tensor,
    pos_max: int,
    neg_min: int,
    surrogate: str,
    grad_threshold: bool,
    *,
    config: LaunchConfig | None = None,
) -> tuple[Tensor, Tensor]:
    """Returns (grad_x, grad θ): grad θ has q_threshold's shape and dtype (empty fp32 unless grad_threshold)."""
    plan = get_plan(x_seq, pos_max, neg_min, surrogate, bwd_cfg=config)
    grad_x, grad_theta = backward(plan, grad_out, x_seq, q_threshold, grad_threshold)
    return grad_x, x_seq.new_empty(0, dtype=torch.float32) if grad_theta is None else grad_theta
