"""Count the aten ops one ASO-SE search step dispatches, and time the step on the host.

The step is ``bench_search_step.py``'s row "top-2, ST-BIF" (8 cells, C = 16, T = 4, firing-rate recording
off) with a tiny batch, so device compute is small and what is left is host work: Python, the dispatcher,
autograd, launches. The op count (and among them the compute ops, those that are not views or
allocations) is a proxy for kernel launches and does not depend on batch or image size; the time is
the median of ``--steps`` synced steps after ``--warmup``. Run it on CUDA for the real count: on CPU the
ST-BIF "auto" backend is the torch reference, a Python loop over T of many small ops.

    PYTHONPATH=. python benchmarks/count_step_ops.py
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.search import supernet as supernet_module  # noqa: E402
from benchmarks.bench_search_step import Row, make_engine, per_term_sum, step_times_ms, synchronize  # noqa: E402
from kernels.st_bif import STBIFNeuron  # noqa: E402

# Ops that only make a view or an allocation: host work, but no kernel launch.
NO_KERNEL = frozenset(f"aten.{name}" for name in (
    "detach", "view", "_unsafe_view", "reshape", "select", "slice", "unsqueeze", "squeeze", "squeeze_",
    "unsqueeze_", "t", "transpose", "permute", "expand", "as_strided", "alias", "unbind", "split",
    "split_with_sizes", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_reshape_alias",
))


class OpCounter(TorchDispatchMode):
    """Counts every op dispatched while active, by its name without the overload (``aten.add``).

    Views and ``empty`` count too (no launch, but host time). Triton launches are not ops: the ST-BIF
    kernel shows only as its launchers' ``empty``/``view`` calls. Under ``TRITON_INTERPRET=1`` the
    interpreter's own copies (``set_``, ``new_empty``, ``copy_``) count as well.
    """

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
    parser.add_argument("--per-term-sum", action="store_true",
                        help="sum each node as before: a multiply per term and an add per pair (the baseline)")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    if args.per_term_sum:
        supernet_module.weighted_sum = per_term_sum
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
          f"{'per-term node sums | ' if args.per_term_sum else ''}"
          f"batch {args.batch} | C={args.channels} | {args.layers} cells | {args.image_size}x{args.image_size}")
    print(f"{'op (mean of ' + str(args.count_steps) + ' steps)':40s} {'per step':>9s}")
    for name in list(per_step)[:args.top]:
        print(f"{name:40s} {per_step[name]:9.1f}")
    print(f"{'total':40s} {sum(per_step.values()):9.1f}")
    print(f"{'  of which compute (may launch a kernel)':40s} "
          f"{sum(count for name, count in per_step.items() if name not in NO_KERNEL):9.1f}")
    print(f"host ms per step: median {statistics.median(times):.1f} (min {min(times):.1f}, {args.steps} steps)")


if __name__ == "__main__":
    main()
