"""cuDNN's dilated depthwise conv against the same conv run by phases (kernels.sparse_conv.dense). Needs a GPU.

    PYTHONPATH=. python benchmarks/bench_dilated_conv.py

DARTS's dil_conv depthwise convs at the CIFAR-10 supernet's shapes (T·B = 256 images, 16/32/64 channels at 32/16/8
pixels, kernels 3 and 5, dilation 2, stride 1 and 2), channels_last, bf16 and fp32. Per case: F.conv2d and
``dense_conv2d`` side by side in one process, forward + backward (input and weight gradients) as eager calls and as
CUDA-graph replays (the GPU's time: how the search's graphed ops run them), microseconds per call from CUDA events
over back-to-back calls, the ratios, and the largest difference of the outputs relative to their largest magnitude.
"""
import datetime
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sparse_conv import back_to_back_us, capture

from kernels.sparse_conv.dense import dense_conv2d

CASES = [(16, 32, 3, 1), (16, 32, 5, 1), (16, 32, 3, 2), (16, 32, 5, 2), (32, 16, 3, 1), (32, 16, 5, 1),
         (32, 16, 5, 2), (64, 8, 3, 1), (64, 8, 5, 1)]
BATCH, DILATION = 256, 2


def main() -> None:
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | cuDNN {torch.backends.cudnn.version()} | "
          f"{datetime.date.today()}")
    print("\n| dtype | C | H=W | k | stride | fwd+bwd eager: cuDNN / phases (µs) | × | fwd+bwd graph replay: cuDNN / "
          "phases (µs) | × | max diff / max |y| |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dtype in (torch.bfloat16, torch.float32):
        for channels, size, kernel, stride in CASES:
            padding = DILATION * (kernel - 1) // 2
            x = torch.randn(BATCH, channels, size, size, device="cuda", dtype=dtype)
            x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
            weight = torch.randn(channels, 1, kernel, kernel, device="cuda", dtype=dtype, requires_grad=True)
            convs = {name: (lambda conv: lambda: conv(x, weight, None, stride, padding, DILATION, channels))(conv)
                     for name, conv in (("cudnn", F.conv2d), ("phases", dense_conv2d))}
            with torch.no_grad():
                want, got = convs["cudnn"](), convs["phases"]()
            upstream = torch.randn_like(want)
            eager, replay = {}, {}
            for name, conv in convs.items():
                def step(conv=conv):
                    return torch.autograd.grad(conv(), (x, weight), upstream)

                eager[name], replay[name] = back_to_back_us(step), back_to_back_us(capture(step).replay)
            diff = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
            print(f"| {str(dtype)[6:]} | {channels} | {size} | {kernel} | {stride} | {eager['cudnn']:.1f} / "
                  f"{eager['phases']:.1f} | {eager['cudnn'] / eager['phases']:.2f} | {replay['cudnn']:.1f} / "
                  f"{replay['phases']:.1f} | {replay['cudnn'] / replay['phases']:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
