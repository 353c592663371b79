"""Does TF32 rounding change how a multi-step spiking network trains? On the CPU, with TF32 emulated.

The GPU tests' tiny spiking DARTS_V2 (ST-BIF, T = 2; tests/aso_se/train/test_retrain_devices_gpu.py) trained eagerly
for two epochs of 12 steps over one batch, drop-path on in epoch 2, from RUNS starts whose weights differ by one
part in a million (the network is chaotic, so only distributions compare), once with fp32 convs and once with every
conv's inputs, weights and gradients rounded to TF32's 10 mantissa bits both ways, as cuDNN's TF32 convs compute:

    python benchmarks/tf32_spiking_training.py --runs 8
    python benchmarks/tf32_spiking_training.py --runs 6 --perturbation 0   # the GPU test's own start
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import statistics
import sys
from pathlib import Path
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.parallel.distributed import DistributedContext  # noqa: E402
from aso_se.train.retrain import Retrainer  # noqa: E402
from search_space.network import build_network  # noqa: E402
from search_space.neurons import NeuronFactory  # noqa: E402


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to nearest (ties away from zero) at TF32's 10 explicit mantissa bits."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).view_as(x)


class TF32Conv2d(torch.autograd.Function):
    """F.conv2d whose three products (forward, input gradient, weight gradient) read TF32-rounded operands."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(x, weight)
        ctx.config, ctx.has_bias = (stride, padding, dilation, groups), bias is not None
        return _CONV2D(round_to_tf32(x), round_to_tf32(weight), bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_tf32 = round_to_tf32(grad)
        grad_x = torch.nn.grad.conv2d_input(x.shape, round_to_tf32(weight), grad_tf32, *ctx.config)
        grad_w = torch.nn.grad.conv2d_weight(round_to_tf32(x), weight.shape, grad_tf32, *ctx.config)
        return grad_x, grad_w, grad.sum((0, 2, 3)) if ctx.has_bias else None, None, None, None, None


_CONV2D = F.conv2d


def _tf32_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(padding, str):  # "same"/"valid": the network's convs pass numbers
        raise ValueError("the TF32 emulation takes numeric padding")
    return TF32Conv2d.apply(x, weight, bias, stride, padding, dilation, groups)


@contextlib.contextmanager
def emulated_tf32_convs() -> Iterator[None]:
    """Every F.conv2d call inside (nn.Conv2d's included) runs as TF32Conv2d."""
    F.conv2d = _tf32_conv2d
    try:
        yield
    finally:
        F.conv2d = _CONV2D


def tiny_network() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_network("DARTS_V2", neuron=NeuronFactory("st_bif", timesteps=2), channels=8, layers=3,
                         num_classes=10, in_channels=1, image_size=16, auxiliary=False)


class _Batches:
    def __init__(self, batches):
        self.batches = batches

    def set_epoch(self, epoch, start_batch=0):
        pass

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def epoch_losses(network: torch.nn.Module, seed: int, steps: int = 12, device: str = "cpu",
                 perturbation: float = 1e-6) -> list[float]:
    """Both epochs' training losses on `device` from `network`'s weights scaled by 1 + perturbation · N(0, 1) (drawn
    from `seed`); the drop-path masks are drawn from `seed` too."""
    network = copy.deepcopy(network)
    generator = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.mul_(1 + perturbation * torch.randn(parameter.shape, generator=generator))
    data = torch.Generator().manual_seed(4)
    batch = (torch.randn(16, 1, 16, 16, generator=data), torch.randint(0, 10, (16,), generator=data))
    torch.manual_seed(seed)
    trainer = Retrainer(
        network, optimizer=functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=3e-4),
        scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=2), epochs=2,
        auxiliary_weight=0.4, drop_path_prob=0.3, grad_clip=5.0, precision="fp32",
        ctx=DistributedContext(torch.device(device)), log_every_n_steps=100)
    assert trainer.fit(_Batches([batch] * steps), _Batches([batch]))
    return [record["train_loss"] for record in trainer.history]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8, help="perturbed starts per arm (default 8)")
    parser.add_argument("--perturbation", type=float, default=1e-6,
                        help="relative weight perturbation of each start (default 1e-6; 0: one start, runs differ "
                             "only in their drop-path masks)")
    args = parser.parse_args(argv)
    if args.perturbation < 0:
        print(f"tf32_spiking_training: --perturbation {args.perturbation}: pass 0 or more", file=sys.stderr)
        return 2
    if args.runs < 2:
        print(f"tf32_spiking_training: --runs {args.runs}: pass 2 or more (a standard deviation needs two)",
              file=sys.stderr)
        return 2
    network = tiny_network()
    print("| convs | epoch 1 loss, mean ± std (range) | epoch 2 loss, mean ± std (range) |\n|---|---|---|")
    for name, context in (("fp32", contextlib.nullcontext), ("TF32 emulated", emulated_tf32_convs)):
        with context():
            losses = [epoch_losses(network, seed, perturbation=args.perturbation) for seed in range(args.runs)]
        cells = []
        for epoch in (0, 1):
            values = [run[epoch] for run in losses]
            cells.append(f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} "
                         f"({min(values):.2f}–{max(values):.2f})")
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
