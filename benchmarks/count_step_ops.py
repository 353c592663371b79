"""Count the aten ops one ASO-SE search step dispatches, and time the step on the host.

The search step of ``bench_search_step.py``'s row "top-2, ST-BIF" (8 cells, C = 16, T = 4,
32x32 input, DARTS's 8 ops, FastMixedOp top-2, learnable-threshold ST-BIF, convs on
``F.conv2d``, firing-rate recording off) with a tiny batch, so that device compute is small
and what is left is host work: Python, the dispatcher, autograd and kernel launches.

Ops are counted with a ``TorchDispatchMode`` over ``--count-steps`` ``ASOSEEngine.train_step``s
(α step + weight step, forwards and backwards, optimizers): every aten op that reaches the
dispatcher's Python key counts once, views and ``empty`` too (they launch nothing on a GPU but
cost host time). Triton launches are not ops: the eager ST-BIF shows only as its launchers'
``empty``/``view`` calls, and launches one kernel per forward and one per backward on top.
The optimizers run their foreach implementations, as torch picks on CUDA (``clip_grad_norm_``
still runs per tensor on CPU). The count is a proxy for kernel launches; it does not depend
on the batch or the image size. The time is the median wall time of ``--steps`` steps after
``--warmup``, each ending with a device sync.

On CPU the ST-BIF "auto" backend is the torch reference (a Python loop over T, many small
ops); on CUDA it is the Triton kernels, so run it on the GPU for the real count. (Under
``TRITON_INTERPRET=1``, ``--neuron-backend triton`` also counts the interpreter's own tensor
copies: ``set_``, ``new_empty``, ``copy_``.)

    PYTHONPATH=. python benchmarks/count_step_ops.py
"""
from __future__ import annotations

import argparse
import collections
import statistics

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.bench_search_step import Row, make_engine, step_times_ms, synchronize
from kernels.st_bif import STBIFNeuron


class OpCounter(TorchDispatchMode):
    """Counts every op dispatched while active, by its name without the overload (``aten.add``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2, help="images per split (the step reads two splits)")
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--neuron", choices=("st_bif", "lif", "relu"), default="st_bif")
    parser.add_argument("--neuron-backend", choices=("auto", "torch", "triton"), default="auto",
                        help="ST-BIF backend (auto: Triton on CUDA, the torch reference on CPU)")
    parser.add_argument("--k", type=int, default=2, help="ops per edge (0: all ops, DARTS's MixedOp)")
    parser.add_argument("--count-steps", type=int, default=3, help="steps counted (the sampled ops vary per step)")
    parser.add_argument("--steps", type=int, default=10, help="steps timed")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    row = Row("count", args.neuron, 1 if args.neuron == "relu" else 4, args.k or None)
    engine = make_engine(row, args.channels, args.layers, device)
    for module in engine.supernet.modules():
        if isinstance(module, STBIFNeuron):
            module.backend = args.neuron_backend
    for optimizer in (engine.weights_optimizer, engine.arch_optimizer):  # as torch defaults on CUDA
        for group in optimizer.param_groups:
            group["foreach"] = True
    inputs = torch.randn(2 * args.batch, 3, args.image_size, args.image_size,
                         generator=torch.Generator().manual_seed(0)).to(device)
    labels = (torch.arange(2 * args.batch) % 10).to(device)
    weights_batch, arch_batch = (inputs[:args.batch], labels[:args.batch]), (inputs[args.batch:], labels[args.batch:])

    def step() -> None:
        engine.train_step(weights_batch, arch_batch, temperature=1.0, entropy_weight=0.0)

    for _ in range(args.warmup):
        step()
    synchronize(device)
    counter = OpCounter()
    with counter:
        for _ in range(args.count_steps):
            step()
    synchronize(device)
    times = step_times_ms(step, device, args.steps)

    per_step = {name: count / args.count_steps for name, count in counter.counts.most_common()}
    print(f"{torch.__version__} | {device} | neuron {args.neuron} ({args.neuron_backend}) | k={args.k or 'all'} | "
          f"batch {args.batch} | C={args.channels} | {args.layers} cells | {args.image_size}x{args.image_size}")
    print(f"{'op (mean of ' + str(args.count_steps) + ' steps)':40s} {'per step':>9s}")
    for name in list(per_step)[:args.top]:
        print(f"{name:40s} {per_step[name]:9.1f}")
    print(f"{'total':40s} {sum(per_step.values()):9.1f}")
    print(f"host ms per step: median {statistics.median(times):.1f} (min {min(times):.1f}, {args.steps} steps)")


if __name__ == "__main__":
    main()
