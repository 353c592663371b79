"""Benchmark of the fused ST-BIF neuron. Needs a CUDA GPU.

    PYTHONPATH=. python benchmarks/bench_st_bif.py [--sweep] [--host-only] [--chain-only] [--pin-cpu CORE]

Checks on the GPU that the Triton path matches the torch reference, runs in a CUDA graph and under
torch.compile(fullgraph=True); then one table against spikingjelly 2.0's Triton ST-BIF (inference
only), torch.compile of our reference, a compiled plain loop and the eager reference (medians of
triton.testing.do_bench, eager calls and CUDA-graph replays; bandwidths against a measured copy),
and one table of host time per eager call (fp32, bf16, fp16; T = 4, 8) against graph replays and
torch.compile, and of one layer inside a chain of 8 (the per-layer cost without the backward call's fixed
cost). N = 64·128·32·32 neurons. --sweep also times the kernels' launch configurations.
--pin-cpu runs the process on one CPU core (as ``taskset -c CORE``): an eager backward hands its work to PyTorch's
autograd thread and waits for it, and that hand-off costs less host time when both threads share one core.
"""
import argparse
import cProfile
import datetime
import functools
import os
import pstats
import time
from importlib.metadata import version

import torch
import triton
from spikingjelly.activation_based import functional as sj_functional
from triton.testing import do_bench

from kernels import native
from kernels.st_bif import STBIFNeuron, level_bounds, st_bif_multistep
from kernels.st_bif.plan import LaunchConfig, st_bif_bwd, st_bif_fwd
from kernels.st_bif.reference import st_bif_loop, st_bif_reference
from kernels.st_bif.surrogates import SURROGATES
from search_space.neurons.st_bif_qann import QuantizedActivation

NEURON_SHAPE = (64, 128, 32, 32)
# A supernet layer (batch 64, 16 channels, 32x32): its kernels take less time than its host work.
CHAIN_SHAPE = (64, 16, 32, 32)
POS_MAX, NEG_MIN = level_bounds(8, sym=True)
SURROGATE = "sigmoid"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def median_us(fn) -> float:
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def hard_spike(u, can_pos, can_neg):
    return (u >= 1).to(u.dtype) * can_pos - (u < 0).to(u.dtype) * can_neg


def ours(x_seq, theta):
    return st_bif_multistep(x_seq, theta, POS_MAX, NEG_MIN, surrogate=SURROGATE, backend="triton")


def reference(x_seq, theta):
    return st_bif_reference(x_seq, theta, POS_MAX, NEG_MIN, SURROGATES[SURROGATE])[0]


def plain_loop(x_seq, theta):
    """The loop with fp32 state and no surrogate: what torch.compile does best (forward only)."""
    return st_bif_loop(x_seq, theta, POS_MAX, NEG_MIN, hard_spike)[0]


def anchor_loop(x_seq, theta):
    """The plain loop as design §6's anchor wrote it: state in the input's dtype, θ a Python
    float, the spike rule inline. Timed too, so the best compiled formulation is the baseline."""
    q = torch.full_like(x_seq[0], 0.5)
    acc = torch.zeros_like(x_seq[0])
    out = []
    for x_t in x_seq:
        q = q + x_t / theta
        s = ((q >= 1) & (acc < POS_MAX)).to(q.dtype) - ((q < 0) & (acc > NEG_MIN)).to(q.dtype)
        acc = acc + s
        q = q - s
        out.append(s * theta)
    return torch.stack(out)


# ---------------------------------------------------------------- checks on the GPU
def check_matches_reference() -> None:
    # Every dtype on an odd 4-D shape and on a long (two-pass backward) one; every surrogate
    # on a larger fp32 shape. Fewer cases than the CPU tests: each is a kernel compilation.
    cases = [
        (shape, dtype, SURROGATE)
        for shape in [(4, 3, 5, 7), (11, 2, 37)]
        for dtype in DTYPES.values()
    ] + [((8, 64, 33, 17), torch.float32, surrogate) for surrogate in SURROGATES]
    grad_x_tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
    for shape, dtype, surrogate in cases:
        x_seq = (torch.randn(shape, device="cuda") * 1.5).to(dtype)
        grad_out = torch.randn(shape, device="cuda").to(dtype)
        results = []
        for backend in ("torch", "triton"):
            x = x_seq.clone().requires_grad_()
            theta = torch.tensor(0.7, device="cuda", requires_grad=True)
            out = st_bif_multistep(
                x, theta, POS_MAX, NEG_MIN, surrogate=surrogate, backend=backend
            )
            results.append((out, *torch.autograd.grad(out, (x, theta), grad_out)))
        (ref_out, ref_gx, ref_gt), (out, gx, gt) = results
        assert torch.equal(out, ref_out), (shape, dtype, surrogate)
        tol = grad_x_tol[dtype]
        torch.testing.assert_close(gx, ref_gx, rtol=tol, atol=tol)
        torch.testing.assert_close(gt, ref_gt, rtol=1e-4, atol=1e-5 * x.numel())
        ref = st_bif_reference(x_seq, theta.detach(), POS_MAX, NEG_MIN, SURROGATES[SURROGATE])
        _, q, acc = st_bif_fwd(x_seq, theta.detach(), POS_MAX, NEG_MIN, with_state=True)
        assert torch.equal(q, ref[1]) and torch.equal(acc, ref[2]), (shape, dtype)
    # The stride-0 gradient of .sum() and a transposed input.
    x = torch.randn(6, 7, 5, device="cuda", requires_grad=True)
    grads = [
        torch.autograd.grad(
            st_bif_multistep(x.transpose(1, 2), 0.45, POS_MAX, NEG_MIN, backend=b).sum(), x
        )[0]
        for b in ("torch", "triton")
    ]
    torch.testing.assert_close(grads[1], grads[0])


def count_mismatches_with_spikingjelly(num_steps: int) -> tuple[int, int]:
    x_seq = torch.randn(num_steps, *NEURON_SHAPE, device="cuda")
    with torch.no_grad():
        sj_out = spikingjelly_forward(x_seq)()
        out = ours(x_seq, torch.tensor(1.0, device="cuda"))
    return int((out != sj_out).sum()), out.numel()


def check_cuda_graph() -> None:
    """Forward+backward of the module captured once, replayed on a new input."""
    neuron = STBIFNeuron(q_threshold=0.8, learn_threshold=True, backend="triton").cuda()
    static_x = torch.randn(4, 8, 16, 9, 9, device="cuda", requires_grad=True)
    static_g = torch.randn_like(static_x)

    def step():
        out = neuron(static_x)
        return (out, *torch.autograd.grad(out, (static_x, neuron.q_threshold), static_g))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        static_x.copy_(torch.randn_like(static_x))
    graph.replay()
    for replayed, eager in zip(captured, step()):
        torch.testing.assert_close(replayed, eager)


def check_compile_fullgraph() -> None:
    neuron = STBIFNeuron(q_threshold=0.8, learn_threshold=True, backend="triton").cuda()
    compiled = torch.compile(neuron, fullgraph=True)
    x = torch.randn(4, 8, 16, 9, 9, device="cuda", requires_grad=True)
    g = torch.randn_like(x)
    results = []
    for module in (neuron, compiled):
        out = module(x)
        results.append((out, *torch.autograd.grad(out, (x, module.q_threshold), g)))
    for traced, eager in zip(results[1], results[0]):
        torch.testing.assert_close(traced, eager)


# ---------------------------------------------------------------- the benchmark
def spikingjelly_forward(x_seq):
    """spikingjelly 2.0's registered (Triton on CUDA) inference op, θ = 1; its initial states
    and parameters are made once, outside the timed call. It also reads and writes states."""
    shape, dev = x_seq.shape[1:], x_seq.device
    q_init = torch.full(shape, 0.5, device=dev)
    acc_init = torch.zeros(shape, device=dev)
    params = [torch.tensor(float(v), device=dev) for v in (1.0, POS_MAX, NEG_MIN)]
    return lambda: sj_functional.stbif_multi_step(x_seq, q_init, acc_init, *params)[0]


def forward_only(fn, x_seq, theta):
    def run():
        with torch.no_grad():
            return fn(x_seq, theta)

    return run


def forward_backward(fn, x_seq, theta, grad_out):
    x = x_seq.detach().requires_grad_()
    theta = theta.detach().requires_grad_()
    return lambda: torch.autograd.grad(fn(x, theta), (x, theta), grad_out)


def graph_replay(name: str, fn):
    """fn captured once in a CUDA graph: its replay, or None where it cannot be captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # outside the capture: compilation, first allocations
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as err:
        print(f"note: {name} cannot be captured in a CUDA graph: {str(err).splitlines()[0]}")
        return None
    return graph.replay


def bench_one(num_steps: int, dtype_name: str, rows: list) -> None:
    dtype = DTYPES[dtype_name]
    x_seq = torch.randn(num_steps, *NEURON_SHAPE, device="cuda").to(dtype)
    grad_out = torch.randn_like(x_seq)
    theta = torch.tensor(1.0, device="cuda")
    step_bytes = num_steps * x_seq[0].numel() * x_seq.element_size()
    copy_dst = torch.empty_like(x_seq)

    torch._dynamo.reset()  # fresh compile caches: no recompile limit falls back to eager
    compiled_reference = torch.compile(reference)
    compiled_plain = torch.compile(plain_loop)
    compiled_anchor = torch.compile(anchor_loop)
    candidates = {
        "copy": (
            2 * step_bytes,
            {"device-to-device copy (x -> out)": lambda: copy_dst.copy_(x_seq)},
        ),
        "forward": (
            2 * step_bytes,
            {
                "ours (Triton)": forward_only(ours, x_seq, theta),
                "ours, also writing final states": forward_only(
                    lambda x, t: st_bif_fwd(x, t, POS_MAX, NEG_MIN, with_state=True)[0],
                    x_seq,
                    theta,
                ),
                "spikingjelly 2.0 Triton (inference)": spikingjelly_forward(x_seq),
                "torch.compile, reference": forward_only(compiled_reference, x_seq, theta),
                "torch.compile, plain fp32 loop": forward_only(compiled_plain, x_seq, theta),
                "torch.compile, plain loop as in design §6": forward_only(compiled_anchor, x_seq, 1.0),
                "eager reference": forward_only(reference, x_seq, theta),
            },
        ),
        "fwd+bwd": (
            5 * step_bytes,
            {
                "ours (Triton)": forward_backward(ours, x_seq, theta, grad_out),
                "torch.compile, reference": forward_backward(
                    compiled_reference, x_seq, theta, grad_out
                ),
                "eager reference": forward_backward(reference, x_seq, theta, grad_out),
            },
        ),
    }
    copy_gbs = None
    for pass_name, (nbytes, fns) in candidates.items():
        times = {}
        for name, fn in fns.items():
            eager_us = median_us(fn)
            replay = graph_replay(name, fn)
            times[name] = (eager_us, median_us(replay) if replay else None)
        if copy_gbs is None:  # the copy comes first: every % below is of this bandwidth
            copy_gbs = nbytes / times["device-to-device copy (x -> out)"][1] / 1e3
        else:
            rows.append((num_steps, dtype_name, pass_name, "byte floor at copy bandwidth", None,
                         nbytes / copy_gbs / 1e3, None, None, None))  # fmt: skip
        ours_us = times.get("ours (Triton)", (None, None))[1]
        for name, (eager_us, graph_us) in times.items():
            gbs = nbytes / graph_us / 1e3 if graph_us else None
            rows.append((num_steps, dtype_name, pass_name, name, eager_us, graph_us,
                         graph_us / ours_us if graph_us and ours_us else None,
                         gbs, 100 * gbs / copy_gbs if gbs else None))  # fmt: skip


def print_table(rows: list) -> None:
    print("| T | dtype | pass | implementation | eager calls µs | graph replay µs | "
          "time / ours | GB/s | % of copy |")  # fmt: skip
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
    for steps, dtype, pass_name, name, eager_us, graph_us, ratio, gbs, pct in rows:
        print(f"| {steps} | {dtype} | {pass_name} | {name} | {fmt(eager_us, '.1f')} | "
              f"{fmt(graph_us, '.1f')} | {fmt(ratio, '.2f')} | {fmt(gbs, '.0f')} | "
              f"{fmt(pct, '.1f')} |")  # fmt: skip


def sweep() -> None:
    """Launch configurations of both kernels (fwd: x -> out; bwd: x, grad_out -> grad_x, θ)."""
    print("\n| kernel | T | dtype | block | warps | median µs | GB/s |")
    print("|---|---|---|---:|---:|---:|---:|")
    theta = torch.tensor(1.0, device="cuda")
    for num_steps in (4, 8):
        for dtype_name in ("fp32", "bf16"):
            x_seq = torch.randn(num_steps, *NEURON_SHAPE, device="cuda").to(DTYPES[dtype_name])
            grad_out = torch.randn_like(x_seq)
            step_bytes = x_seq.numel() * x_seq.element_size()
            copy_dst = torch.empty_like(x_seq)
            us = median_us(lambda: copy_dst.copy_(x_seq))
            print(f"| copy | {num_steps} | {dtype_name} | | | {us:.1f} | "
                  f"{2 * step_bytes / us / 1e3:.0f} |")  # fmt: skip
            for block, warps in ((512, 4), (1024, 4), (1024, 8)):
                config = LaunchConfig(block, warps)
                us = median_us(lambda: st_bif_fwd(x_seq, theta, POS_MAX, NEG_MIN, config=config))
                print(f"| fwd | {num_steps} | {dtype_name} | {block} | {warps} | {us:.1f} | "
                      f"{2 * step_bytes / us / 1e3:.0f} |")  # fmt: skip
            for block, warps in ((256, 4), (512, 4), (512, 8)):
                config = LaunchConfig(block, warps)
                us = median_us(lambda: st_bif_bwd(grad_out, x_seq, theta, POS_MAX, NEG_MIN,
                                                  SURROGATE, True, config=config))  # fmt: skip
                print(f"| bwd | {num_steps} | {dtype_name} | {block} | {warps} | {us:.1f} | "
                      f"{3 * step_bytes / us / 1e3:.0f} |")  # fmt: skip


# ---------------------------------------------------------------- host time per call
def host_wall_event_us(fn, calls: int = 40, repeats: int = 5) -> tuple[float, float, float]:
    """Per call of fn over `calls` back-to-back calls (best of `repeats`): the host's time in the
    loop (time.perf_counter, no sync inside it), the wall time to the GPU's end (one sync after
    the loop) and the GPU's span between CUDA events recorded before and after the loop. Host
    time below the GPU's time means the launches run ahead and the GPU never waits."""
    fn()
    torch.cuda.synchronize()
    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = (float("inf"),) * 3
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        start_event.record()
        for _ in range(calls):
            fn()
        host = time.perf_counter() - start
        end_event.record()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        event = start_event.elapsed_time(end_event) / 1e3
        best = tuple(min(b, v / calls * 1e6) for b, v in zip(best, (host, wall, event)))
    return best


def python_calls_per_call(fn, calls: int = 20) -> tuple[float, float]:
    """(function calls, Python frames among them) per call of fn, counted by cProfile."""
    fn()
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profile)
    python = sum(v[1] for k, v in stats.stats.items() if not k[0].startswith("~"))  # "~": builtins
    return stats.total_calls / calls, python / calls


def host_rows(num_steps: int, dtype_name: str) -> list[tuple]:
    """(T, dtype, implementation, pass, host µs, wall µs, event µs, graph replay µs) rows."""
    dtype = DTYPES[dtype_name]
    x = torch.randn(num_steps, *NEURON_SHAPE, device="cuda").to(dtype).requires_grad_()
    grad_out = torch.randn_like(x)
    neuron = STBIFNeuron(q_threshold=1.0, learn_threshold=True, backend="triton").cuda()
    theta = neuron.q_threshold
    torch._dynamo.reset()
    compiled_reference = torch.compile(reference)
    compiled_neuron = torch.compile(neuron)

    def fwd_bwd(module):
        return lambda: torch.autograd.grad(module(x), (x, theta), grad_out)

    def forward(module):
        def run():
            with torch.no_grad():
                return module(x)

        return run

    candidates = {
        ("floor: one native op (x * θ)", "fwd+bwd"): lambda: torch.autograd.grad(x * theta, (x, theta), grad_out),
        ("ours eager (STBIFNeuron, learnable θ)", "fwd+bwd"): fwd_bwd(neuron),
        ("ours eager (STBIFNeuron, learnable θ)", "forward"): forward(neuron),
        ("ours under torch.compile", "fwd+bwd"): fwd_bwd(compiled_neuron),
        ("torch.compile, reference", "fwd+bwd"): fwd_bwd(lambda x_seq: compiled_reference(x_seq, theta)),
        ("torch.compile, reference", "forward"): forward(lambda x_seq: compiled_reference(x_seq, theta)),
    }
    rows = []
    for (name, pass_name), fn in candidates.items():
        host_us, wall_us, event_us = host_wall_event_us(fn)
        replay = graph_replay(name, fn)
        graph_us = host_wall_event_us(replay)[2] if replay else None
        rows.append((num_steps, dtype_name, name, pass_name, host_us, wall_us, event_us, graph_us))
    return rows


def print_host_table(rows: list) -> None:
    print("\n| T | dtype | implementation | pass | host µs / call | wall µs / call | GPU span µs / call | "
          "graph replay µs | span / replay |")  # fmt: skip
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for steps, dtype, name, pass_name, host_us, wall_us, event_us, graph_us in rows:
        graph = f"{graph_us:.1f} | {event_us / graph_us:.2f}" if graph_us else " | "
        print(f"| {steps} | {dtype} | {name} | {pass_name} | {host_us:.1f} | {wall_us:.1f} | {event_us:.1f} | "
              f"{graph} |")  # fmt: skip


class _NoKernel(torch.autograd.Function):
    """The least a Python autograd.Function costs: what ours does minus its kernels and its θ gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, theta)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.saved_tensors  # unpacked, as ours does: part of the cost
        return grad_out, None


def chain_rows(dtype_name: str, length: int = 8) -> list[tuple]:
    """Host µs of one layer's eager fwd+bwd inside a network: `length` layers in a row, each with its own θ,
    under one autograd.grad call, against one layer alone. (chain − alone) / (length − 1) is what each layer
    adds; the rest is the fixed cost of the backward call, paid once per loss.backward()."""
    x = torch.randn(4, *CHAIN_SHAPE, device="cuda").to(DTYPES[dtype_name]).requires_grad_()
    grad_out = torch.randn_like(x)
    neurons = [STBIFNeuron(q_threshold=1.0, learn_threshold=True, backend="triton").cuda() for _ in range(length)]
    thetas = [neuron.q_threshold for neuron in neurons]
    quantizers = [QuantizedActivation(q_threshold=0.5, level=16, sym=False).cuda() for _ in range(length)]
    layers = {
        "native op (x · θ), θ learnable": ([functools.partial(torch.mul, other=theta) for theta in thetas], thetas),
        "Python autograd.Function, no kernel": ([lambda h, theta=theta: _NoKernel.apply(h, theta) for theta in thetas],
                                                thetas),
        "ours (STBIFNeuron, learnable θ)": (neurons, thetas),
        "ours: the QANN quantizer (QuantizedActivation), learnable θ": (
            quantizers, [quantizer.q_threshold for quantizer in quantizers]),
    }
    rows = []
    for name, (fns, params) in layers.items():
        def run(count, fns=fns, params=params):
            return lambda: torch.autograd.grad(functools.reduce(lambda h, f: f(h), fns[:count], x),
                                               (x, *params[:count]), grad_out, allow_unused=True)

        alone_host, alone_wall, _ = host_wall_event_us(run(1))
        chain_host, chain_wall, _ = host_wall_event_us(run(length))
        forward_host = host_wall_event_us(lambda fn=fns[0]: fn(x))[0]
        rows.append((dtype_name, name, alone_host, chain_host, (chain_host - alone_host) / (length - 1),
                     chain_wall / length, forward_host))
    return rows


def print_chain_table(rows: list) -> None:
    print(f"\nOne layer's eager fwd+bwd inside a network (T = 4, {'x'.join(map(str, CHAIN_SHAPE))} per step): a "
          "chain of 8 layers per autograd.grad call")
    print("| dtype | layer | host µs: alone | host µs: chain of 8 | host µs per layer in the chain | "
          "wall µs per layer in the chain | host µs: forward |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    for dtype, name, alone, chain, per_layer, wall, forward in rows:
        print(f"| {dtype} | {name} | {alone:.1f} | {chain:.1f} | {per_layer:.1f} | {wall:.1f} | {forward:.1f} |")


def host_table() -> None:
    # The chains first: after torch.compile (in host_rows) the same rows cost more host time, and vary more.
    chains = [row for dtype_name in ("fp32", "bf16") for row in chain_rows(dtype_name)]
    rows = [row for num_steps in (4, 8) for dtype_name in DTYPES for row in host_rows(num_steps, dtype_name)]
    print_host_table(rows)
    print_chain_table(chains)
    x = torch.randn(4, *NEURON_SHAPE, device="cuda", requires_grad=True)
    neuron = STBIFNeuron(q_threshold=1.0, learn_threshold=True, backend="triton").cuda()
    grad_out = torch.randn_like(x)
    calls, frames = python_calls_per_call(lambda: torch.autograd.grad(neuron(x), (x, neuron.q_threshold), grad_out))
    print(f"\nours eager fwd+bwd, T=4 fp32: {calls:.0f} function calls per call, {frames:.0f} of them Python frames")


def pin_process(core: int) -> None:
    """Every thread of this process, and so every thread it starts later, on CPU ``core`` alone."""
    if core not in os.sched_getaffinity(0):
        raise SystemExit(f"--pin-cpu {core}: this process may run on cores {sorted(os.sched_getaffinity(0))} only; "
                         "pick one of them")
    for thread_id in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread_id), {core})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time launch configurations")
    parser.add_argument("--host-only", action="store_true", help="only the tables of host time per call")
    parser.add_argument("--chain-only", action="store_true",
                        help="only the table of host time per layer in a chain (runs against an older checkout too: "
                             "cd <checkout> && PYTHONPATH=. python <this file> --chain-only)")
    parser.add_argument("--pin-cpu", type=int, default=None, metavar="CORE",
                        help="run on this CPU core alone (before CUDA starts its threads)")
    args = parser.parse_args()
    if args.pin_cpu is not None:
        pin_process(args.pin_cpu)
    torch.manual_seed(0)
    pinned = "unpinned" if args.pin_cpu is None else f"pinned to CPU {args.pin_cpu}"
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton "
          f"{triton.__version__} | spikingjelly {version('spikingjelly')} | "
          f"{datetime.date.today()} | {pinned}")  # fmt: skip
    node = "off (ASO_SE_NATIVE=0)" if not native.enabled() else (
        "on" if native.wait() is not None else f"not built: {native.build_error()}")
    print(f"eager neurons' C++ autograd node (kernels/native): {node}")
    if args.chain_only:
        print_chain_table([row for dtype_name in ("fp32", "bf16") for row in chain_rows(dtype_name)])
        return
    if args.host_only:
        host_table()
        return
    print("spikingjelly stbif implementation:",
          sj_functional.neuron_implementation("stbif", torch.device("cuda")))  # fmt: skip
    check_matches_reference()
    print("check: Triton == reference on CUDA (out, final states exact; grads of x and θ close)")
    check_cuda_graph()
    print("check: forward+backward captured in a CUDA graph and replayed: matches eager")
    check_compile_fullgraph()
    print("check: torch.compile(fullgraph=True) forward+backward matches eager")
    for num_steps in (4, 8):
        differ, total = count_mismatches_with_spikingjelly(num_steps)
        print(f"check: T={num_steps} fp32 outputs differing from spikingjelly's kernel: "
              f"{differ} of {total}")  # fmt: skip
    rows = []
    for num_steps in (4, 8):
        for dtype_name in ("fp32", "bf16"):
            bench_one(num_steps, dtype_name, rows)
    print_table(rows)
    host_table()
    if args.sweep:
        sweep()


if __name__ == "__main__":
    main()
