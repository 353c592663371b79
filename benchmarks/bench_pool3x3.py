"""Benchmark: DARTS's 3x3 pools (stride 1 and 2) forward + backward on channels_last CUDA tensors, our Triton
kernels (and other blocks of them) against PyTorch's pools in both layouts.

    python benchmarks/bench_pool3x3.py [--shapes 96x72x32x32,256x144x16x16] [--dtype fp32|bf16|fp16]
"""
from __future__ import annotations

import argparse
import datetime
import functools

import torch
import torch.nn.functional as F
import triton.testing

from kernels.pool3x3 import pool3x3
from kernels.pool3x3 import triton as pool_triton

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def fwd_bwd(fn, x, grad):
    x.grad = None
    fn(x).backward(grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="96x72x32x32,96x144x16x16,256x72x32x32,256x144x16x16")
    parser.add_argument("--dtype", default="fp32", choices=DTYPES)
    parser.add_argument("--variants", default="", help="other blocks, e.g. 1024:4,2048:8 (elements:warps)")
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    print(f"{datetime.date.today()} {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; "
          "µs per forward+backward (do_bench median)")
    print("| shape | kind | stride | ours | torch NHWC | torch NCHW | " +
          " | ".join(f"ours {v}" for v in args.variants.split(",") if v) + " |")
    original_block, original_warps = pool_triton.BLOCK, pool_triton.NUM_WARPS
    for spec in args.shapes.split(","):
        n, c, h, w = (int(v) for v in spec.split("x"))
        for kind in ("max", "avg"):
            for stride in (1, 2):
                x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
                x.requires_grad_(True)
                out = pool3x3(x, kind, stride)
                grad = torch.randn_like(out)
                ours = triton.testing.do_bench(lambda: fwd_bwd(functools.partial(pool3x3, kind=kind, stride=stride),
                                                                x, grad))
                ref = F.max_pool2d if kind == "max" else functools.partial(F.avg_pool2d, count_include_pad=False)
                torch_fn = functools.partial(ref, kernel_size=3, stride=stride, padding=1)
                nhwc = triton.testing.do_bench(lambda: fwd_bwd(torch_fn, x, grad))
                xc = x.detach().contiguous().requires_grad_(True)
                nchw = triton.testing.do_bench(lambda: fwd_bwd(torch_fn, xc, grad.contiguous()))
                extra = []
                for variant in filter(None, args.variants.split(",")):
                    pool_triton.BLOCK, pool_triton.NUM_WARPS = (int(v) for v in variant.split(":"))
                    pool_triton._BWD_HANDLES.clear()
                    pool_triton._FWD_HANDLES.clear()
                    extra.append(triton.testing.do_bench(
                        lambda: fwd_bwd(functools.partial(pool3x3, kind=kind, stride=stride), x, grad)))
                    pool_triton.BLOCK, pool_triton.NUM_WARPS = original_block, original_warps
                    pool_triton._BWD_HANDLES.clear()
                    pool_triton._FWD_HANDLES.clear()
                cells = " | ".join(f"{t * 1e3:.0f}" for t in extra)
                print(f"| {spec} | {kind} | {stride} | {ours * 1e3:.0f} | {nhwc * 1e3:.0f} | {nchw * 1e3:.0f} | "
                      f"{cells} |", flush=True)


if __name__ == "__main__":
    main()
