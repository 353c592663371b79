"""Benchmark: the quantizer's kernels on one full-size retrain step's calls, against PyTorch's bandwidth. Needs a GPU.

The calls are those of DARTS_V2 20 x 36 (aux head) as the ST-BIF QANN, at --batch, channels_last: their input
shapes, found by a forward at batch 2 and scaled. GPU time per step (do_bench_cudagraph, no host time) of the
forward, the backward with and without θ's gradient, beside the same bytes moved by PyTorch: a copy (read 1,
write 1, as the forward) and an add (read 2, write 1, as the backward). --bwd-configs times the backward's
launch configurations (BWD_BLOCK:BWD_NUM_WARPS:BWD_PROGRAMS_PER_SM), the first being the kernels' own.

    python benchmarks/bench_quantizer.py --bwd-configs 2048:4:16,4096:8:8,1024:4:16
"""
from __future__ import annotations

import argparse
import collections
import datetime

import torch
from triton.testing import do_bench_cudagraph

from kernels.quantizer import triton as qt
from search_space.network import build_network
from search_space.neurons import NeuronFactory
from search_space.neurons.st_bif_qann import QuantizedActivation


def step_shapes(batch: int) -> collections.Counter:
    """{input shape at `batch`: calls per step} of the network's quantizers (one forward; each also runs backward)."""
    network = build_network("DARTS_V2", neuron=NeuronFactory("st_bif_qann", timesteps=1), channels=36, layers=20,
                            num_classes=10, auxiliary=True)
    shapes: collections.Counter = collections.Counter()
    for module in network.modules():
        if isinstance(module, QuantizedActivation):
            module.register_forward_hook(lambda m, inputs, out: shapes.update([(batch, *inputs[0].shape[1:])]))
    network.train()(torch.randn(2, 3, 32, 32))
    return shapes


def per_step_ms(shapes: collections.Counter, work, dtype: torch.dtype) -> float:
    """Σ over shapes of calls × GPU ms of `work(x, grad, theta)` on random channels_last tensors of that shape."""
    total = 0.0
    for shape, calls in shapes.items():
        x = torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
        grad = torch.randn_like(x)
        theta = torch.tensor([0.25], device="cuda")
        work(x, grad, theta)  # compile and cache the launch outside the graph
        total += calls * do_bench_cudagraph(lambda: work(x, grad, theta), rep=50)
    return total


def use_bwd_config(block: int, warps: int, programs_per_sm: int | None = None) -> None:
    qt.BWD_BLOCK, qt.BWD_NUM_WARPS = block, warps
    if programs_per_sm is not None:
        qt.BWD_PROGRAMS_PER_SM = programs_per_sm
    qt._BWD_HANDLES.clear()  # launch handles are kept per key, which does not name the block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--bwd-configs", default=f"{qt.BWD_BLOCK}:{qt.BWD_NUM_WARPS}:{qt.BWD_PROGRAMS_PER_SM}",
                        help="BWD_BLOCK:BWD_NUM_WARPS:BWD_PROGRAMS_PER_SM,... (the first is the kernels' own)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    shapes = step_shapes(args.batch)
    elements = sum(calls * torch.Size(shape).numel() for shape, calls in shapes.items())
    size = torch.finfo(dtype).bits // 8
    print(f"{datetime.date.today()} {torch.cuda.get_device_name()}, torch {torch.__version__}; {sum(shapes.values())} "
          f"quantizer calls per step of DARTS_V2 20x36 at batch {args.batch}, {elements / 1e9:.2f} G elements, "
          f"{args.dtype} channels_last; GPU ms per step (CUDA-graph replays)")
    copy = per_step_ms(shapes, lambda x, g, t: x.clone(), dtype)
    add = per_step_ms(shapes, lambda x, g, t: torch.add(x, g), dtype)
    fwd = per_step_ms(shapes, lambda x, g, t: qt.quantize_fwd(x, t, -8, 7), dtype)
    print(f"| PyTorch copy (read 1, write 1) | {copy:.2f} ms | {2 * size * elements / copy / 1e9:.2f} TB/s |")
    print(f"| PyTorch add (read 2, write 1) | {add:.2f} ms | {3 * size * elements / add / 1e9:.2f} TB/s |")
    print(f"| forward | {fwd:.2f} ms | {2 * size * elements / fwd / 1e9:.2f} TB/s | {fwd / copy:.2f}x the copy |")
    print("| backward BWD_BLOCK:warps:programs per SM | with θ's gradient | TB/s | / add | without θ's gradient "
          "| / add |\n|---|---:|---:|---:|---:|---:|")
    for config in args.bwd_configs.split(","):
        use_bwd_config(*map(int, config.split(":")))
        with_theta = per_step_ms(shapes, lambda x, g, t: qt.quantize_bwd(g, x, t, -8, 7, True), dtype)
        without = per_step_ms(shapes, lambda x, g, t: qt.quantize_bwd(g, x, t, -8, 7, False), dtype)
        print(f"| {config} | {with_theta:.2f} ms | {3 * size * elements / with_theta / 1e9:.2f} | "
              f"{with_theta / add:.2f}x | {without:.2f} ms | {without / add:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
