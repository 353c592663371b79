"""Triton kernels of the multi-step ST-BIF neuron: forward and backward (their launches: plan.py).

Both kernels view the sequence as [T, N] (N neurons, any strides; outputs contiguous) and give
each program BLOCK neurons whose states stay in registers for the whole sequence; T is a
constexpr, and the time loop is unrolled in chunks of CHUNK steps, each issuing all its loads
before its first store. Nothing is saved for backward but x: the backward kernel replays the
forward from x (one extra pass over x for T > CHUNK, to find each chunk's start state).
HBM traffic per neuron-step, b bytes per element: forward 2b, backward 3b (+b for T > CHUNK).
"""
import triton
import triton.language as tl

from kernels.dependent_launch import wait_then_release
from kernels.partial_sums import store_partial_and_total


@triton.jit
def _st_bif_step(q, acc, x, theta, pos_max, neg_min):
    """One time step of the neuron in fp32; returns (u, s, can_fire_pos, can_fire_neg)."""
    # IEEE division, as torch: the gates depend on u. Its fast path rejects a zero numerator, and a
    # warp with one zero lane runs the slow path, which made silent inputs slow; 0 / θ is exactly
    # x * (1 / θ) for any θ, NaN included.
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
    done_counter_ptr,
    grad_theta_ptr,
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
        store_partial_and_total(grad_theta_partial_ptr, done_counter_ptr, grad_theta_ptr, tl.sum(grad_theta, axis=0))
