"""Benchmark: the supernet's BatchNorm and depthwise convs, forward+backward, in each memory layout and kernel.

The GPU-bound search step (BPTT at T = 4, batch 256) spends most of its GPU time in non-affine BatchNorms
and depthwise convs on NCHW fp32 tensors with 16-64 channels (RESULTS.md, search step). For the step's
shapes ([T*B, C, H, W]), one process times each way PyTorch offers to run them: BatchNorm native or cuDNN
(no weight vs a unit weight), NCHW or channels_last, and as plain torch ops; depthwise 3x3/5x5 convs in
NCHW (native kernels) or channels_last (cuDNN); 1x1 convs on cuDNN or, in channels_last, as matrix products
(``MatmulPointwise``, fp32 or TF32); 3x3 average and max pools (stride 1 and 2) in each layout, the average
also as a depthwise conv of ones, both also as our Triton kernels (``kernels.pool3x3``). Each row: median ms
per forward+backward and its ratio to one copy of the input (2 passes over its bytes; a BatchNorm
forward+backward needs about 8), and the max difference of output and gradients (input; a conv's weight too)
from the first row of its group.

    python benchmarks/bench_norm_conv.py [--batch 256 --timesteps 4]
    python benchmarks/bench_norm_conv.py --convs-only --dtype fp16 --shapes 1024x36x32x32,1024x72x16x16,1024x144x8x8
    python benchmarks/bench_norm_conv.py --tiny     # CPU smoke run of the script itself
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from kernels.pool3x3 import pool3x3

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


def conv_variants(channels: int, kernel: int, device: torch.device, dtype: torch.dtype = torch.float32
                  ) -> dict[str, Way]:
    weight = torch.randn(channels, 1, kernel, kernel, device=device, dtype=dtype, requires_grad=True)

    def depthwise(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight if x.is_contiguous() else weight.to(memory_format=torch.channels_last),
                        padding=kernel // 2, groups=channels)

    depthwise.weight = weight  # run_group also takes the weight's gradient, as training does
    return {f"depthwise {kernel}x{kernel}, NCHW": depthwise, f"depthwise {kernel}x{kernel}, channels_last": depthwise}


@contextlib.contextmanager
def _matmul_tf32(enabled: bool) -> Iterator[None]:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


class MatmulPointwise(torch.autograd.Function):
    """A 1x1 conv of a channels_last [N, C, H, W] tensor as one matrix product over its [N*H*W, C] rows, and
    its two gradients as two more (cuBLAS), in full fp32 or TF32 (the product's flag set in both passes)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, tf32: bool) -> torch.Tensor:
        n, c, h, w = x.shape
        rows = x.permute(0, 2, 3, 1).reshape(-1, c)  # a view for channels_last memory
        ctx.save_for_backward(rows, weight)
        ctx.tf32, ctx.shape = tf32, (n, h, w)
        with _matmul_tf32(tf32):
            out = rows @ weight.view(weight.shape[0], c).t()
        return out.view(n, h, w, -1).permute(0, 3, 1, 2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        rows, weight = ctx.saved_tensors
        n, h, w = ctx.shape
        grad_rows = grad.permute(0, 2, 3, 1).reshape(-1, weight.shape[0])
        with _matmul_tf32(ctx.tf32):
            grad_x = grad_rows @ weight.view(weight.shape[0], -1)
            grad_w = grad_rows.t() @ rows
        return grad_x.view(n, h, w, -1).permute(0, 3, 1, 2), grad_w.view(weight.shape), None


def pointwise_variants(channels: int, device: torch.device) -> dict[str, Way]:
    """DARTS's 1x1 convs (C -> C, no bias): cuDNN in each layout, and channels_last as matrix products."""
    weight = torch.randn(channels, channels, 1, 1, device=device, requires_grad=True)

    def cudnn(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight if x.is_contiguous() else weight.to(memory_format=torch.channels_last))

    def matmul(x: torch.Tensor) -> torch.Tensor:
        return MatmulPointwise.apply(x, weight, False)

    def matmul_tf32(x: torch.Tensor) -> torch.Tensor:
        return MatmulPointwise.apply(x, weight, True)

    for way in (cudnn, matmul, matmul_tf32):
        way.weight = weight
    return {"1x1 cuDNN, NCHW": cudnn, "1x1 cuDNN, channels_last": cudnn, "1x1 matmul fp32, channels_last": matmul,
            "1x1 matmul TF32, channels_last": matmul_tf32}


def pool_variants(channels: int, height: int, width: int, stride: int, device: torch.device) -> dict[str, Way]:
    """DARTS's 3x3 pools (padding 1; the average over the window's pixels inside the image): native kernels in
    each layout, and the average as a depthwise conv of ones (cuDNN) times 1 / the window's pixel count."""
    ones = torch.ones(channels, 1, 3, 3, device=device)
    counts = F.conv2d(torch.ones(1, 1, height, width, device=device), ones[:1], stride=stride, padding=1)

    def average(x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, 3, stride, 1, count_include_pad=False)

    def box_conv(x: torch.Tensor) -> torch.Tensor:
        kernel = ones if x.is_contiguous() else ones.to(memory_format=torch.channels_last)
        return F.conv2d(x, kernel, stride=stride, padding=1, groups=channels) / counts

    def maximum(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 3, stride, 1)

    def triton_average(x: torch.Tensor) -> torch.Tensor:  # kernels.pool3x3 ("auto": PyTorch's on a CPU)
        return pool3x3(x, "avg", stride)

    def triton_maximum(x: torch.Tensor) -> torch.Tensor:
        return pool3x3(x, "max", stride)

    name = f"3x3/{stride}"
    return {f"avg {name} native, NCHW": average, f"avg {name} native, channels_last": average,
            f"avg {name} ones conv, channels_last": box_conv, f"avg {name} Triton, channels_last": triton_average}, {
            f"max {name} native, NCHW": maximum, f"max {name} native, channels_last": maximum,
            f"max {name} Triton, channels_last": triton_maximum}


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
    with torch.no_grad():  # the output's shape (a stride-2 pool halves it)
        upstream = torch.randn_like(next(iter(variants.values()))(x))
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


DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """"1024x36x32x32,1024x72x16x16" -> [(1024, 36, 32, 32), (1024, 72, 16, 16)]."""
    shapes = [tuple(int(size) for size in item.split("x")) for item in text.split(",") if item]
    if not shapes or any(len(shape) != 4 or min(shape) < 1 for shape in shapes):
        raise SystemExit(f"bench_norm_conv: --shapes {text!r}: give N x C x H x W sizes, e.g. 1024x36x32x32")
    return shapes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="images per split")
    parser.add_argument("--timesteps", type=int, default=4, help="T: the tensors hold T*batch samples")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: batch 2, T = 1, 2 reps")
    parser.add_argument("--shapes", help="N x C x H x W tensors instead of the search step's, e.g. the retrain's: "
                        "1024x36x32x32,1024x72x16x16,1024x144x8x8 (with --convs-only)")
    parser.add_argument("--convs-only", action="store_true", help="only the depthwise convs, at every shape")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="the depthwise convs' dtype (--convs-only)")
    args = parser.parse_args(argv)
    if args.dtype != "fp32" and not args.convs_only:
        raise SystemExit("bench_norm_conv: --dtype fp16/bf16 times the depthwise convs only; add --convs-only")
    if args.tiny:
        args.batch, args.timesteps, args.reps = 2, 1, 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    torch.manual_seed(0)
    n = args.batch * args.timesteps
    shapes = parse_shapes(args.shapes) if args.shapes else [(n, 16, 32, 32), (n, 48, 32, 32), (n, 32, 16, 16),
                                                            (n, 64, 8, 8)]
    dtype = DTYPES[args.dtype]
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'} | torch {torch.__version__} | "
          f"cuDNN {torch.backends.cudnn.version()} | {args.dtype}, shapes {shapes}")
    print("| shape | way | fwd+bwd (ms) | × one copy | max diff from the group's first row |")
    print("|---|---|---:|---:|---:|")
    for shape in shapes:
        x = (torch.randn(shape, device=device) * 2 + 0.5).to(dtype)
        name = "x".join(map(str, shape))
        if args.convs_only:  # e.g. the retrain's fp16 separable and dilated convs (5x5 ones: issue #44's arms)
            for kernel in (3, 5):
                for row in run_group(f"{name}", conv_variants(shape[1], kernel, device, dtype), x, device, args.reps):
                    print(row, flush=True)
            continue
        for row in run_group(f"BN {name}", batch_norm_variants(shape[1], device), x, device, args.reps):
            print(row, flush=True)
        groups = {}
        if shape[1] <= 32:  # the cell's depthwise convs run at C = 16 and 32
            groups.update({f"conv{kernel}": conv_variants(shape[1], kernel, device) for kernel in (3, 5)})
        if shape[1] != 48:  # cells run at C = 16, 32, 64 (48: the stem's output only)
            groups["pointwise"] = pointwise_variants(shape[1], device)
            for stride in (1, 2):
                groups[f"avg{stride}"], groups[f"max{stride}"] = pool_variants(*shape[1:], stride, device)
        for group in groups.values():
            for row in run_group(f"{name}", group, x, device, args.reps):
                print(row, flush=True)


if __name__ == "__main__":
    main()
