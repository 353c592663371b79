"""Triton kernels of the multi-step ST-BIF neuron (forward and backward) and their launchers.

Both kernels view the sequence as [T, N] (N neurons, any strides; the output is contiguous)
and give each program BLOCK neurons whose states live in registers for the whole sequence.
T is a constexpr: the time loop is unrolled in chunks of CHUNK steps, and each chunk issues
all its loads before its first store, so many loads are in flight per thread.

Nothing is saved for backward but the input x (the caller keeps it): the backward kernel
replays the forward from x to rebuild u_t and the counter gates in registers, then walks
the chunk back in time. For T <= CHUNK that is one pass; for longer sequences a first pass
replays the forward to find the state at each chunk start (x is then read twice).

HBM traffic per neuron-step (b = bytes of the input dtype: 4 fp32, 2 bf16/fp16):
  forward   read x, write out                        2b   (fp32: 8 B)
  backward  read x, read grad_out, write grad_x      3b   (fp32: 12 B; + b if T > CHUNK)
  together                                           5b   (fp32: 20 B; bf16: 10 B)
plus, for a learnable threshold, one fp32 partial sum per program (deterministically summed).
"""
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.block_map import BlockMap
from kernels.dependent_launch import use_pdl, wait_then_release

from .surrogates import get_surrogate

MAP_BLOCK = 8  # side of a block of the sparse conv's block map (kernels.sparse_conv.geometry.BLOCK)
# Steps kept in registers at once: bounds register use for long sequences.
_MAX_CHUNK = 8
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _st_bif_step(q, acc, x, theta, pos_max, neg_min):
    """One time step of design §3 in fp32; returns (u, s, can_fire_pos, can_fire_neg)."""
    # IEEE division, as torch: the gates depend on u. Its fast path rejects a zero numerator, and a
    # warp with one zero lane runs the slow path, so zero drive (silent inputs) cost the forward
    # 78 instead of 53 µs (H100, RESULTS.md). 0 / θ is exactly x * (1 / θ) for any θ, NaN included.
    nonzero = x != 0
    u = q + tl.where(nonzero, tl.math.div_rn(tl.where(nonzero, x, 1.0), theta), x * (1.0 / theta))
    can_pos = acc < pos_max
    can_neg = acc > neg_min
    s = ((u >= 1.0) & can_pos).to(tl.float32) - ((u < 0.0) & can_neg).to(tl.float32)
    return u, s, can_pos, can_neg


@triton.jit
def _surrogate_derivative(z, SURROGATE: tl.constexpr, ALPHA: tl.constexpr):
    """σ′(z) of the surrogate named SURROGATE (same formulas as surrogates.py)."""
    if SURROGATE == "sigmoid":
        sig = tl.sigmoid(ALPHA * z)
        derivative = ALPHA * sig * (1.0 - sig)
    elif SURROGATE == "atan":
        w = (1.5707963267948966 * ALPHA) * z  # π/2 · α · z
        derivative = (ALPHA / 2) / (1.0 + w * w)
    else:  # rectangular
        derivative = (tl.abs(z) < ALPHA / 2).to(tl.float32) / ALPHA
    return derivative


@triton.jit
def _st_bif_fwd_kernel(
    x_ptr,
    out_ptr,
    q_out_ptr,
    acc_out_ptr,
    theta_ptr,
    map_ptr,
    planes_ptr,
    n_neurons,
    x_stride_t,
    x_stride_n,
    pos_max,
    neg_min,
    T: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    WRITE_STATE: tl.constexpr,
    WRITE_MAP: tl.constexpr,
    MAP_BLOCK: tl.constexpr,
    CHANNELS: tl.constexpr,
    HEIGHT: tl.constexpr,
    WIDTH: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_then_release(PDL)  # wait for x's writer, then let the conv's packing launch
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_neurons
    theta = tl.load(theta_ptr).to(tl.float32)
    x_base = x_ptr + offs * x_stride_n
    out_base = out_ptr + offs
    x_stride_t = tl.cast(x_stride_t, tl.int64)  # T·N may exceed 2**31
    out_stride_t = tl.cast(n_neurons, tl.int64)
    if WRITE_MAP:
        # Neuron (b, c, h, w) of step t spiking sets map[t*B + b, h // 8, w // 8, c]: a plain store
        # of 1, so lanes racing on one flag all write the same value (no atomics, no reduction).
        # The plane's sizes are constexprs and the indices int32 (the launcher checks N < 2**31):
        # divisions by run-time int64 values cost more than the neuron itself.
        BLOCK_ROWS: tl.constexpr = (HEIGHT + MAP_BLOCK - 1) // MAP_BLOCK
        BLOCK_COLS: tl.constexpr = (WIDTH + MAP_BLOCK - 1) // MAP_BLOCK
        # Rows that hold whole blocks (W % 8 == 0): OR each run of 8 neurons first, one store per block row.
        GROUP: tl.constexpr = MAP_BLOCK if WIDTH % MAP_BLOCK == 0 else 1
        neuron = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK // GROUP) * GROUP).to(tl.int32)
        group_ok = neuron < n_neurons
        plane = neuron // (HEIGHT * WIDTH)
        pixel = neuron - plane * (HEIGHT * WIDTH)
        row = pixel // WIDTH
        sample = plane // CHANNELS
        block = (sample * BLOCK_ROWS + row // MAP_BLOCK) * BLOCK_COLS + (pixel - row * WIDTH) // MAP_BLOCK
        map_base = map_ptr + block * CHANNELS + (plane - sample * CHANNELS)
        map_stride_t = tl.cast(
            n_neurons // (HEIGHT * WIDTH * CHANNELS) * (BLOCK_ROWS * BLOCK_COLS * CHANNELS), tl.int64
        )
        # The plane flags [T*B, C]: the same store of 1, at the group's plane (b*C + c) of step t.
        planes_base = planes_ptr + plane
        planes_stride_t = tl.cast(n_neurons // (HEIGHT * WIDTH), tl.int64)

    q = tl.full([BLOCK], 0.5, tl.float32)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in tl.static_range(0, T, CHUNK):
        xs = ()
        for k in tl.static_range(CHUNK):
            if start + k < T:
                xs += (tl.load(x_base + (start + k) * x_stride_t, mask=mask, other=0.0),)
        for k in tl.static_range(CHUNK):
            if start + k < T:
                u, s, _, _ = _st_bif_step(q, acc, xs[k].to(tl.float32), theta, pos_max, neg_min)
                acc += s
                q = u - s
                out = (s * theta).to(out_ptr.dtype.element_ty)
                tl.store(out_base + (start + k) * out_stride_t, out, mask=mask)
                if WRITE_MAP:
                    spiking = tl.max(tl.reshape((s != 0).to(tl.int32), (BLOCK // GROUP, GROUP)), axis=1)
                    tl.store(map_base + (start + k) * map_stride_t, tl.full([BLOCK // GROUP], 1, tl.int8),
                             mask=group_ok & (spiking != 0))
                    tl.store(planes_base + (start + k) * planes_stride_t, tl.full([BLOCK // GROUP], 1, tl.int8),
                             mask=group_ok & (spiking != 0))
    if WRITE_STATE:
        tl.store(q_out_ptr + offs, q, mask=mask)
        tl.store(acc_out_ptr + offs, acc, mask=mask)


@triton.jit
def _st_bif_bwd_kernel(
    x_ptr,
    grad_out_ptr,
    grad_x_ptr,
    theta_ptr,
    grad_theta_partial_ptr,
    n_neurons,
    x_stride_t,
    x_stride_n,
    g_stride_t,
    g_stride_n,
    pos_max,
    neg_min,
    T: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    SURROGATE: tl.constexpr,
    ALPHA: tl.constexpr,
    GRAD_THRESHOLD: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_neurons
    theta = tl.load(theta_ptr).to(tl.float32)
    x_base = x_ptr + offs * x_stride_n
    g_base = grad_out_ptr + offs * g_stride_n
    gx_base = grad_x_ptr + offs
    x_stride_t = tl.cast(x_stride_t, tl.int64)
    g_stride_t = tl.cast(g_stride_t, tl.int64)
    gx_stride_t = tl.cast(n_neurons, tl.int64)
    NUM_CHUNKS: tl.constexpr = (T + CHUNK - 1) // CHUNK

    # Pass 1 (only when T > CHUNK): the state (q, acc) at the start of every chunk.
    q = tl.full([BLOCK], 0.5, tl.float32)
    acc = tl.zeros([BLOCK], tl.float32)
    q_starts = (q,)
    acc_starts = (acc,)
    for t in tl.static_range((NUM_CHUNKS - 1) * CHUNK):
        x = tl.load(x_base + t * x_stride_t, mask=mask, other=0.0).to(tl.float32)
        u, s, _, _ = _st_bif_step(q, acc, x, theta, pos_max, neg_min)
        acc += s
        q = u - s
        if t % CHUNK == CHUNK - 1:
            q_starts += (q,)
            acc_starts += (acc,)

    # Pass 2: chunks last to first. Each chunk first issues all its loads (none waits behind
    # a store), replays the forward to get ds_t/du_t, then runs BPTT back through the chunk.
    # Masked lanes load x = 0 and grad_out = 0, so they add exactly 0 to the threshold grad.
    grad_q = tl.zeros([BLOCK], tl.float32)
    grad_out_dot_s = tl.zeros([BLOCK], tl.float32)  # Σ_t g_out_t·s_t
    grad_u_dot_x = tl.zeros([BLOCK], tl.float32)  # Σ_t g_u_t·x_t
    for start in tl.static_range((NUM_CHUNKS - 1) * CHUNK, -1, -CHUNK):
        xs = ()
        grad_outs = ()
        for k in tl.static_range(CHUNK):
            if start + k < T:
                x = tl.load(x_base + (start + k) * x_stride_t, mask=mask, other=0.0)
                xs += (x.to(tl.float32),)
                g_out = tl.load(g_base + (start + k) * g_stride_t, mask=mask, other=0.0)
                grad_outs += (g_out.to(tl.float32),)
        q = q_starts[start // CHUNK]
        acc = acc_starts[start // CHUNK]
        ds_dus = ()
        for k in tl.static_range(CHUNK):
            if start + k < T:
                u, s, can_pos, can_neg = _st_bif_step(q, acc, xs[k], theta, pos_max, neg_min)
                acc += s
                q = u - s
                ds_du = _surrogate_derivative(u - 1.0, SURROGATE, ALPHA) * can_pos.to(
                    tl.float32
                ) + _surrogate_derivative(-u, SURROGATE, ALPHA) * can_neg.to(tl.float32)
                ds_dus += (ds_du,)
                if GRAD_THRESHOLD:
                    grad_out_dot_s += grad_outs[k] * s
        for k in tl.static_range(CHUNK - 1, -1, -1):
            if start + k < T:
                # s_t feeds out_t = s_t·θ and q_t = u_t − s_t; u_t also feeds q_t directly.
                grad_u = (grad_outs[k] * theta - grad_q) * ds_dus[k] + grad_q
                grad_x = (grad_u / theta).to(grad_x_ptr.dtype.element_ty)
                tl.store(gx_base + (start + k) * gx_stride_t, grad_x, mask=mask)
                if GRAD_THRESHOLD:
                    grad_u_dot_x += grad_u * xs[k]
                grad_q = grad_u
    if GRAD_THRESHOLD:
        # out_t = s_t·θ and u_t = q_{t-1} + x_t/θ: dL/dθ = Σ g_out·s − Σ g_u·x / θ².
        grad_theta = grad_out_dot_s - grad_u_dot_x / (theta * theta)
        tl.store(grad_theta_partial_ptr + pid, tl.sum(grad_theta, axis=0))


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


def _device_guard(x: Tensor) -> torch.cuda.device:
    """Launches on x's GPU whatever the current device is (a no-op on CPU)."""
    return torch.cuda.device(x.device.index if x.is_cuda else -1)


def _chunk(num_steps: int) -> int:
    return min(num_steps, _MAX_CHUNK)


class LaunchConfig(NamedTuple):
    block: int  # neurons per program
    num_warps: int = 4


# From the launch sweep on an H200 (benchmarks/RESULTS.md): the more steps a chunk keeps in
# registers, the fewer neurons per thread; the backward keeps ~3 values per step, the
# forward 1, so the backward takes half the block.
def fwd_config(num_steps: int) -> LaunchConfig:
    return LaunchConfig(block=1024 if _chunk(num_steps) <= 4 else 512)


def bwd_config(num_steps: int) -> LaunchConfig:
    return LaunchConfig(block=512 if _chunk(num_steps) <= 4 else 256)


def bwd_num_programs(x_seq: Tensor) -> int:
    """Programs of the default backward launch: the length of its threshold-grad partials."""
    return triton.cdiv(x_seq[0].numel(), bwd_config(x_seq.shape[0]).block)


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
    _check_triton_input(x_seq)
    num_steps = x_seq.shape[0]
    block, num_warps = config or fwd_config(num_steps)
    x2d = x_seq.reshape(num_steps, -1)  # a view whenever the strides allow
    n = x2d.shape[1]
    out = torch.empty(x_seq.shape, dtype=x_seq.dtype, device=x_seq.device)
    q_final = acc_final = None
    if with_state:
        q_final = torch.empty(x_seq.shape[1:], dtype=torch.float32, device=x_seq.device)
        acc_final = torch.empty_like(q_final)
    if n == 0:
        return out, q_final, acc_final
    with _device_guard(x_seq):
        # Map variants are compiled per plane shape (a few per network); others share one.
        channels, height, width = x_seq.shape[2:] if block_map is not None else (1, 1, 1)
        pdl = block_map is not None and use_pdl(x_seq)  # the map's reader, the conv, follows
        _st_bif_fwd_kernel[(triton.cdiv(n, block),)](
            x2d, out, q_final, acc_final, q_threshold,
            *(block_map if block_map is not None else (None, None)),
            n, x2d.stride(0), x2d.stride(1), pos_max, neg_min,
            T=num_steps, CHUNK=_chunk(num_steps), BLOCK=block, WRITE_STATE=with_state,
            WRITE_MAP=block_map is not None, MAP_BLOCK=MAP_BLOCK, CHANNELS=channels, HEIGHT=height, WIDTH=width,
            PDL=pdl, num_warps=num_warps, launch_pdl=pdl,
        )  # fmt: skip
    return out, q_final, acc_final


def can_write_block_map(x_seq: Tensor) -> bool:
    """Whether the forward kernel can write a block map for x_seq: [T, B, C, H, W], and int32
    neuron indices (fewer than 2**31 neurons per step)."""
    return x_seq.dim() == 5 and x_seq[0].numel() < 2**31


def new_block_map(x_seq: Tensor) -> BlockMap:
    """The zeroed block map that `st_bif_fwd(..., block_map=)` fills, for x_seq [T, B, C, H, W]:
    its blocks and plane flags share one allocation, so one memset zeroes both."""
    if not can_write_block_map(x_seq):
        raise ValueError(f"a block map needs a [T, B, C, H, W] sequence of fewer than 2**31 neurons per step, "
                         f"got shape {tuple(x_seq.shape)}")
    steps, batch, channels, height, width = x_seq.shape
    shape = (steps * batch, triton.cdiv(height, MAP_BLOCK), triton.cdiv(width, MAP_BLOCK), channels)
    blocks = shape[0] * shape[1] * shape[2] * channels
    buffer = torch.zeros(blocks + steps * batch * channels, dtype=torch.int8, device=x_seq.device)
    return BlockMap(buffer[:blocks].view(shape), buffer[blocks:].view(steps * batch, channels))


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
    """Returns (grad_x, partials): partials sum to grad θ (empty unless grad_threshold)."""
    _check_triton_input(x_seq)
    sg = get_surrogate(surrogate)
    num_steps = x_seq.shape[0]
    block, num_warps = config or bwd_config(num_steps)
    x2d = x_seq.reshape(num_steps, -1)
    g2d = grad_out.reshape(num_steps, -1)  # may be non-contiguous, even stride 0
    n = x2d.shape[1]
    grad_x = torch.empty(x_seq.shape, dtype=x_seq.dtype, device=x_seq.device)
    num_programs = triton.cdiv(n, block)
    partials = torch.empty(num_programs if grad_threshold else 0, device=x_seq.device)
    if n == 0:
        return grad_x, partials
    with _device_guard(x_seq):
        _st_bif_bwd_kernel[(num_programs,)](
            x2d, g2d, grad_x, q_threshold, partials,
            n, x2d.stride(0), x2d.stride(1), g2d.stride(0), g2d.stride(1), pos_max, neg_min,
            T=num_steps, CHUNK=_chunk(num_steps), BLOCK=block,
            SURROGATE=sg.name, ALPHA=sg.alpha, GRAD_THRESHOLD=grad_threshold,
            num_warps=num_warps,
        )  # fmt: skip
    return grad_x, partials
