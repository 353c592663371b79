"""Speed case depthwise: the depthwise convs of the retrain step, forward and backward, cuDNN's beside ours.

    python benchmarks/speed.py --case depthwise                 # DARTS_V2 20×36's depthwise shapes, batch 1024, fp16
    python benchmarks/speed.py --case depthwise --tiny          # CPU smoke run (TRITON_INTERPRET=1), no rows

Why: the retrain step's profile puts cuDNN's channels_last depthwise backward first among single kernels, several
times its bytes' floor. kernels/depthwise_conv makes both gradients in one pass. Per shape (those of the sep_conv
and dil_conv ops of a 20×36 network: 32×32 at 36 channels, 16×16 at 72, 8×8 at 144, stride 2 where a reduction cell
reads its inputs), one process times a forward and backward of each implementation on the same tensors, and a
forward alone: the host's wall clock over ``--steps`` synced calls (what a user pays, launches included), the median
of ``--repeats``. Beside each: the least bytes of the pair (forward: read x and the weight, write y; backward: read
the output gradient, x and the weight, write both gradients) at the GPU's HBM bandwidth, the share of it reached,
and the largest difference between the two implementations' outputs and gradients (the kernels' check in the same
run).
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import speed_roofline
from benchmarks.rows import Measurement
from benchmarks.speed_retrain_step import sync
from kernels.depthwise_conv import depthwise_conv2d

IMPLEMENTATIONS = ("torch", "triton")
# (channels, size, kernel, stride, dilation): sep_conv_3x3 (two depthwise convs), dil_conv_3x3 and their strided
# first convs on reduction edges, per stage of DARTS's 20×36 network (36, 72, 144 channels).
SHAPES = ((36, 32, 3, 1, 1), (36, 32, 3, 1, 2), (36, 32, 3, 2, 1), (72, 16, 3, 1, 1), (72, 16, 3, 1, 2),
          (72, 16, 3, 2, 1), (144, 8, 3, 1, 1), (144, 8, 3, 1, 2))
TINY_SHAPES = ((4, 6, 3, 1, 1), (4, 6, 3, 2, 2))


def least_bytes(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> int:
    """Forward: x, w in, y out; backward: grad_y, x, w in, grad_x, grad_w out."""
    xb, yb, wb = (t.numel() * t.element_size() for t in (x, y, weight))
    return (xb + wb + yb) + (yb + xb + wb + xb + wb)


def forward_backward(x, weight, upstream, geometry, backend):
    y = depthwise_conv2d(x, weight, *geometry, backend=backend)
    return (y, *torch.autograd.grad(y, [x, weight], upstream))


def forward_only(x, weight, upstream, geometry, backend):
    with torch.no_grad():
        return depthwise_conv2d(x, weight, *geometry, backend=backend)


def time_calls(call, x, weight, upstream, geometry, backend, steps, repeats, device) -> float:
    """Median seconds of one ``call`` (forward_backward or forward_only), host wall clock of synced calls."""
    call(x, weight, upstream, geometry, backend)  # compile, cuDNN's choice
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            call(x, weight, upstream, geometry, backend)
        sync(device)
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> list[Measurement]:
    parser = argparse.ArgumentParser(prog="speed.py --case depthwise", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hbm-gbps", type=float, help="HBM bandwidth in GB/s (default: by the GPU's name)")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: two small shapes, one step")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = SHAPES
    if args.tiny:
        args.batch, args.steps, args.repeats, shapes = 2, 1, 1, TINY_SHAPES
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    gbps = speed_roofline.hbm_gbps(name, speed_roofline.CPU_SMOKE_GBPS if device.type == "cpu" and args.hbm_gbps
                                   is None else args.hbm_gbps)
    dtype = getattr(torch, args.dtype)
    torch.backends.cudnn.benchmark = True
    print(f"{datetime.date.today()} {name}, torch {torch.__version__}; depthwise conv forward + backward, batch "
          f"{args.batch}, {args.dtype}, channels_last, HBM {gbps:.0f} GB/s")
    print("| channels | size | kernel | stride | dilation | cuDNN ms | ours ms | ours / cuDNN | "
          "forward: cuDNN / ours ms | floor ms | cuDNN % HBM | ours % HBM | max difference |\n|" + "---:|" * 13)
    rows, total = [], {backend: 0.0 for backend in IMPLEMENTATIONS}
    generator = torch.Generator(device=device).manual_seed(0)
    for channels, size, kernel, stride, dilation in shapes:
        geometry = (stride, dilation * (kernel - 1) // 2, dilation)
        x = torch.randn(args.batch, channels, size, size, device=device, generator=generator, dtype=dtype)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        weight = (torch.randn(channels, 1, kernel, kernel, device=device, generator=generator) / kernel).to(dtype)
        weight.requires_grad_()
        y = depthwise_conv2d(x.detach(), weight.detach(), *geometry, backend="torch")
        upstream = torch.randn(y.shape, device=device, generator=generator, dtype=dtype)
        upstream = upstream.contiguous(memory_format=torch.channels_last)
        outputs = {backend: forward_backward(x, weight, upstream, geometry, backend) for backend in IMPLEMENTATIONS}
        difference = max((a.float() - b.float()).abs().max().item() / max(1.0, b.float().abs().max().item())
                         for a, b in zip(outputs["triton"], outputs["torch"]))
        seconds = {backend: time_calls(forward_backward, x, weight, upstream, geometry, backend, args.steps,
                                       args.repeats, device) for backend in IMPLEMENTATIONS}
        forward = {backend: time_calls(forward_only, x, weight, upstream, geometry, backend, args.steps,
                                       args.repeats, device) for backend in IMPLEMENTATIONS}
        floor = least_bytes(x, y, weight) / (gbps * 1e9)
        for backend in IMPLEMENTATIONS:
            total[backend] += seconds[backend]
        print(f"| {channels} | {size} | {kernel} | {stride} | {dilation} | {seconds['torch'] * 1e3:.3f} | "
              f"{seconds['triton'] * 1e3:.3f} | {seconds['triton'] / seconds['torch']:.2f} | "
              f"{forward['torch'] * 1e3:.3f} / {forward['triton'] * 1e3:.3f} | {floor * 1e3:.3f} | "
              f"{100 * floor / seconds['torch']:.0f} | {100 * floor / seconds['triton']:.0f} | {difference:.1e} |",
              flush=True)
        what = (f"depthwise {kernel}×{kernel} stride {stride} dilation {dilation}, {channels} channels {size}×{size}, "
                f"batch {args.batch}, {args.dtype}, forward + backward")
        note = f"floor {floor * 1e3:.3f} ms at {gbps:.0f} GB/s; largest relative difference {difference:.1e}"
        rows += [Measurement("depthwise", f"{what}: cuDNN", round(seconds["torch"] * 1e3, 3), "ms", note),
                 Measurement("depthwise", f"{what}: ours", round(seconds["triton"] * 1e3, 3), "ms", note),
                 Measurement("depthwise", f"{what}: ours / cuDNN", round(seconds["triton"] / seconds["torch"], 2),
                             "x", note),
                 Measurement("depthwise", f"{what}: forward alone, ours / cuDNN",
                             round(forward["triton"] / forward["torch"], 2), "x",
                             f"cuDNN {forward['torch'] * 1e3:.3f} ms, ours {forward['triton'] * 1e3:.3f} ms")]
    rows.append(Measurement("depthwise", f"every shape once, batch {args.batch}, {args.dtype}: ours / cuDNN",
                            round(total["triton"] / total["torch"], 2), "x",
                            f"cuDNN {total['torch'] * 1e3:.2f} ms, ours {total['triton'] * 1e3:.2f} ms"))
    print(f"every shape once: cuDNN {total['torch'] * 1e3:.2f} ms, ours {total['triton'] * 1e3:.2f} ms "
          f"({total['triton'] / total['torch']:.2f}x)")
    return rows
