"""Speed case st_bif: the fused ST-BIF neuron against spikingjelly 2.0, torch.compile and its byte floor. Needs a GPU.

    python benchmarks/speed.py --case st_bif

Checks on the GPU that the Triton path matches the torch reference, runs in a CUDA graph and under
torch.compile(fullgraph=True); then one table against spikingjelly 2.0's Triton ST-BIF (inference
only), torch.compile of our reference, a compiled plain loop and the eager reference (medians of
triton.testing.do_bench, eager calls and CUDA-graph replays; bandwidths against a copy measured in the same run).
N = 64·128·32·32 neurons, T = 4 and 8, fp32 and bf16. The graph replays and byte floors become result rows.
"""
import argparse
import datetime
import sys
from importlib.metadata import version
from pathlib import Path

import torch
import triton
from spikingjelly.activation_based import functional as sj_functional
from triton.testing import do_bench

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.rows`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rows import Measurement
from kernels.st_bif import STBIFNeuron, level_bounds, st_bif_multistep
from kernels.st_bif.plan import st_bif_fwd
from kernels.st_bif.reference import st_bif_loop, st_bif_reference
from kernels.st_bif.surrogates import SURROGATES

NEURON_SHAPE = (64, 128, 32, 32)
POS_MAX, NEG_MIN = level_bounds(8, sym=True)
SURROGATE = "sigmoid"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


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


def measurements(rows: list) -> list[Measurement]:
    """The table's rows as result rows: graph replays (GPU time) of every implementation, and the byte floors."""
    found = []
    for steps, dtype, pass_name, name, eager_us, graph_us, ratio, gbs, pct in rows:
        if graph_us is not None:
            replay = "" if name.startswith("byte floor") else ", graph replay"
            found.append(Measurement("st_bif", f"T={steps} {dtype} {pass_name}: {name}{replay}",
                                     round(graph_us, 1), "µs", "N = 64·128·32·32 neurons, θ learnable"))
    return found


def main(argv: list[str] | None = None) -> list[Measurement]:
    parser = argparse.ArgumentParser(prog="speed.py --case st_bif", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton "
          f"{triton.__version__} | spikingjelly {version('spikingjelly')} | "
          f"{datetime.date.today()}")  # fmt: skip
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
    return measurements(rows)
