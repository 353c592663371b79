"""Spike-sparse convolution on wide layers. Needs a CUDA GPU.

    PYTHONPATH=. python benchmarks/bench_sparse_conv_wide.py

conv3x3 with 256 output channels on [64, C_in, 14, 14] spikes with 90% of the (sample,
channel) planes silent, NCHW, C_in in {256, 512, 1024, 2048}. The NCHW forward compacts each
tile's active channels in registers over a list padded to a power of two, so the width is what
this exercises. Per C_in and dtype (fp16, bf16, fp32): the error of
`sparse_conv2d(backend="triton")` against an fp32 conv, its first call (compile included), and
its median time next to `F.conv2d` on the same tensors (triton.testing.do_bench, which flushes
L2 before every call; both eager). Then, in fp16, the dispatcher (`SparseConv2d`, backend
"auto", called eagerly: it runs cuDNN) against `F.conv2d`, with the paths it took.
"""
import datetime
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from benchmarks.bench_sparse_conv import relative_error, spikes  # noqa: E402
from kernels.sparse_conv import SparseConv2d, path_counts, reset_path_counts, sparse_conv2d  # noqa: E402

WIDTHS = (256, 512, 1024, 2048)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
OUT_CHANNELS, BATCH, SIZE, SILENT_PLANES = 256, 64, 14, 0.9


def median_us(fn) -> float:  # do_bench's default warm-up and repetitions (bench_sparse_conv's are shorter)
    return 1000.0 * do_bench(fn, return_mode="median")


def main() -> None:
    generator = torch.Generator("cuda").manual_seed(0)
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
          f"{datetime.date.today()} | conv3x3 -> {OUT_CHANNELS} on [{BATCH}, C_in, {SIZE}, {SIZE}], "
          f"{SILENT_PLANES:.0%} silent planes, NCHW\n")
    print("| C_in | dtype | rel err | first call (s) | ours µs | cuDNN µs | ×cuDNN |\n"
          "|---:|---|---:|---:|---:|---:|---:|")
    inputs = {}
    for channels in WIDTHS:
        x = spikes((BATCH, channels, SIZE, SIZE), 0.5, SILENT_PLANES, generator)
        weight = torch.randn(OUT_CHANNELS, channels, 3, 3, generator=generator, device="cuda") / (9 * channels) ** 0.5
        inputs[channels] = x.half()
        reference = F.conv2d(x, weight, None, 1, 1)
        for name, dtype in DTYPES.items():
            x_, w_ = x.to(dtype), weight.to(dtype)
            start = time.perf_counter()
            y = sparse_conv2d(x_, w_, None, 1, 1, backend="triton")
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            ours = median_us(lambda: sparse_conv2d(x_, w_, None, 1, 1, backend="triton"))
            cudnn = median_us(lambda: F.conv2d(x_, w_, None, 1, 1))
            print(f"| {channels} | {name} | {relative_error(y, reference):.1e} | {first:.1f} | {ours:.1f} | "
                  f"{cudnn:.1f} | {cudnn / ours:.2f} |", flush=True)
    print("\n| C_in | dispatcher µs | cuDNN µs | ×cuDNN | paths |\n|---:|---:|---:|---:|---|")
    for channels, x in inputs.items():
        module = SparseConv2d(channels, OUT_CHANNELS, 3, padding=1, bias=False).cuda().half().requires_grad_(False)
        with torch.no_grad():
            module(x)  # routes the layer
            torch.cuda.synchronize()
            reset_path_counts()
            dispatcher = median_us(lambda: module(x))
            paths = path_counts()
            cudnn = median_us(lambda: F.conv2d(x, module.weight, None, 1, 1))
        print(f"| {channels} | {dispatcher:.1f} | {cudnn:.1f} | {cudnn / dispatcher:.2f} | {paths} |", flush=True)


if __name__ == "__main__":
    main()
