"""Benchmark: the supernet's BatchNorm and depthwise convs, forward+backward, in each memory layout and kernel.

The GPU-bound search step (BPTT at T = 4, batch 256) spends most of its GPU time in non-affine BatchNorms
and depthwise convs on NCHW fp32 tensors with 16-64 channels (RESULTS.md, search step). For the step's
shapes ([T*B, C, H, W]), one process times each way PyTorch offers to run them: BatchNorm native or cuDNN
(no weight vs a unit weight), NCHW or channels_last, and as plain torch ops; depthwise 3x3/5x5 convs in
NCHW (native kernels) or channels_last (cuDNN). Each row: median ms per forward+backward and its ratio to
one copy of the input (2 passes over its bytes; a BatchNorm forward+backward needs about 8), and the max
difference of output and gradients (input; a conv's weight too) from the first row of its group.

    python benchmarks/bench_norm_conv.py [--batch 256 --timesteps 4]
    python benchmarks/bench_norm_conv.py --tiny     # CPU smoke run of the script itself
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

Way = Callable[[torch.Tensor], torch.Tensor]


def batch_norm_variants(channels: int, device: torch.device) -> dict[str, Way]:
    ones, zeros = torch.ones(channels, device=device), torch.zeros(channels, device=device)

    def plain(x: torch.Tensor) -> torch.Tensor:  # PyTorch's native kernels (no weight)
        return F.batch_norm(x, None, None, None, None, training=True)

    def unit(x: torch.Tensor) -> torch.Tensor:  # cuDNN (a weight and bias are given)
        return F.batch_norm(x, None, None, ones, zeros, training=True)

    def torch_ops(x: torch.Tensor) -> torch.Tensor:  # reductions and elementwise ops through autograd
        var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=False, keepdim=True)
        return (x - mean) * torch.rsqrt(var + 1e-5)

    return {"native, NCHW": plain, "cuDNN, NCHW": unit, "torch ops, NCHW": torch_ops,
            "native, channels_last": plain, "cuDNN, channels_last": unit}


def conv_variants(channels: int, kernel: int, device: torch.device) -> dict[str, Way]:
    weight = torch.randn(channels, 1, kernel, kernel, device=device, requires_grad=True)

    def depthwise(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight if x.is_contiguous() else weight.to(memory_format=torch.channels_last),
                        padding=kernel // 2, groups=channels)

    depthwise.weight = weight  # run_group also takes the weight's gradient, as training does
    return {f"depthwise {kernel}x{kernel}, NCHW": depthwise, f"depthwise {kernel}x{kernel}, channels_last": depthwise}


def median_ms(fn: Callable[[], None], device: torch.device, reps: int) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def run_group(name: str, variants: dict, x: torch.Tensor, device: torch.device, reps: int) -> list[str]:
    upstream = torch.randn_like(x)
    copy_ms = median_ms(lambda: torch.empty_like(x).copy_(x), device, reps)
    rows, reference = [], None
    for label, fn in variants.items():
        layout = torch.channels_last if "channels_last" in label else torch.contiguous_format
        xin = x.to(memory_format=layout).requires_grad_()
        grad_out = upstream.to(memory_format=layout)

        learned = [fn.weight] if hasattr(fn, "weight") else []

        def step() -> tuple[torch.Tensor, ...]:
            out = fn(xin)
            return (out, *torch.autograd.grad(out, [xin, *learned], grad_out))

        results = step()
        if reference is None:
            reference, diff = [t.detach() for t in results], 0.0
        else:
            diff = max((got - want).abs().max().item() for got, want in zip(results, reference))
        ms = median_ms(step, device, reps)
        rows.append(f"| {name} | {label} | {ms:.3f} | {ms / copy_ms:.1f} | {diff:.1e} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="images per split")
    parser.add_argument("--timesteps", type=int, default=4, help="T: the tensors hold T*batch samples")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: batch 2, T = 1, 2 reps")
    args = parser.parse_args()
    if args.tiny:
        args.batch, args.timesteps, args.reps = 2, 1, 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    torch.manual_seed(0)
    n = args.batch * args.timesteps
    shapes = [(n, 16, 32, 32), (n, 48, 32, 32), (n, 32, 16, 16), (n, 64, 8, 8)]
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'} | torch {torch.__version__} | "
          f"cuDNN {torch.backends.cudnn.version()} | fp32, T*B = {n}")
    print("| shape | way | fwd+bwd (ms) | × one copy | max diff from the group's first row |")
    print("|---|---|---:|---:|---:|")
    for shape in shapes:
        x = torch.randn(shape, device=device) * 2 + 0.5
        name = "x".join(map(str, shape))
        for row in run_group(f"BN {name}", batch_norm_variants(shape[1], device), x, device, args.reps):
            print(row, flush=True)
        if shape[1] <= 32:  # the cell's depthwise convs run at C = 16 and 32
            for kernel in (3, 5):
                for row in run_group(f"conv {name}", conv_variants(shape[1], kernel, device), x, device, args.reps):
                    print(row, flush=True)


if __name__ == "__main__":
    main()
