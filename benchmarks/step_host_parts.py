"""Host time of each part of one search step (no profiler, no syncs inside): where a host-bound step goes.

Times one ``bench_search_step.py`` row in blocks of 10 back-to-back steps, with ``time.perf_counter`` around the
supernet's forward, its cells, the graphed ops, the node sums, the pools, both backwards, gradient clipping and the
optimizers; prints ms per step and calls per step of each part (parts nest: indented ones sit inside others).

    PYTHONPATH=. python benchmarks/step_host_parts.py --images /tmp/cifar10/train [--row 36] [--batch 64]
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_search_step as bench

import aso_se.search.engine as engine_module
import aso_se.search.step as step_module
from aso_se.search import architect, graphed_ops, supernet
from kernels.pool3x3.function import Pool3x3Function
from kernels.weighted_sum.function import TorchWeightedSum, TritonWeightedSum

SECONDS: dict[str, float] = collections.defaultdict(float)
CALLS: dict[str, int] = collections.defaultdict(int)


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[name] += time.perf_counter() - start
            CALLS[name] += 1
    return wrapper


def instrument(engine) -> None:
    """Wraps the step's parts (classes and this engine's optimizers) with timers."""
    supernet.SearchNetwork.forward = timed("supernet forward (both steps)", supernet.SearchNetwork.forward)
    supernet.SearchCell.forward = timed("  cells' forward", supernet.SearchCell.forward)
    graphed_ops.OpGraphs.__call__ = timed("    ops' forward (graphed or eager)", graphed_ops.OpGraphs.__call__)
    graphed_ops._Replay.backward = staticmethod(timed("  graphed ops' backward", graphed_ops._Replay.backward))
    for cls in (TritonWeightedSum, TorchWeightedSum):
        cls.forward = staticmethod(timed("    node sums' forward", cls.forward))
        cls.backward = staticmethod(timed("  node sums' backward", cls.backward))
    Pool3x3Function.forward = staticmethod(timed("    pools' forward", Pool3x3Function.forward))
    Pool3x3Function.backward = staticmethod(timed("  pools' backward", Pool3x3Function.backward))
    step_module.first_order_arch_step = timed("alpha step: forward + backward", architect.first_order_arch_step)
    torch.Tensor.backward = timed("weight step: backward", torch.Tensor.backward)
    torch.nn.utils.clip_grad_norm_ = timed("clip_grad_norm_", torch.nn.utils.clip_grad_norm_)
    engine.weights_optimizer.step = timed("weights optimizer step", engine.weights_optimizer.step)
    engine.weights_optimizer.zero_grad = timed("zero_grad", engine.weights_optimizer.zero_grad)
    engine.arch_optimizer.step = timed("arch optimizer step", engine.arch_optimizer.step)
    engine_module.ASOSEEngine.train_step = timed("the whole step", engine_module.ASOSEEngine.train_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, default=None, help="CIFAR-10 train/ folder (random images if not given)")
    parser.add_argument("--row", type=int, default=36, help="bench_search_step.py's row number (1-based)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("step_host_parts.py times a GPU step's host work: it needs a CUDA device")
    device = torch.device("cuda")
    row = bench.ROWS[args.row - 1]
    images = bench.load_images(args.images, 2 * args.batch)
    labels = torch.arange(2 * args.batch) % 10
    engine = bench.make_engine(row, 16, 8, device)
    layout = torch.channels_last if row.channels_last else torch.contiguous_format
    weights_batch = (images[:args.batch].to(device, memory_format=layout), labels[:args.batch].to(device))
    arch_batch = (images[args.batch:].to(device, memory_format=layout), labels[args.batch:].to(device))

    def step() -> None:
        engine.train_step(weights_batch, arch_batch, temperature=1.0, entropy_weight=0.0, next_temperature=1.0)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    instrument(engine)
    print(f"row {args.row}: {row.name}, batch {args.batch}; {torch.cuda.get_device_name()}")
    for block in range(args.blocks):
        SECONDS.clear()
        CALLS.clear()
        start = time.perf_counter()
        for _ in range(10):
            step()
        host = time.perf_counter() - start
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        print(f"--- block {block}: host {host * 100:.1f} ms/step, wall {wall * 100:.1f} ms/step "
              f"({20 * args.batch / wall:.0f} images/s)")
        for name in sorted(SECONDS, key=lambda k: -SECONDS[k]):
            print(f"{name:40s} {SECONDS[name] * 100:7.2f} ms/step {CALLS[name] / 10:7.1f} calls/step")


if __name__ == "__main__":
    main()
