"""Several ranks with graphs reduce the gradients between two replays (FlatGradients); on two CPU
processes (gloo) that split step, run eagerly, trains as DDP does: same losses, same weights, in fp32 and in fp16
with loss scaling (the full-budget arms' precision on 2 GPUs)."""
from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from aso_se.parallel.distributed import DistributedContext
from aso_se.train.retrain import Retrainer
from search_space.network import build_network
from search_space.neurons import NeuronFactory
from tests.aso_se.train.ddp_runs import assert_trains_as_ddp

PRECISIONS_AND_REDUCTIONS = [(p, r) for p in ("fp32", "fp16") for r in ("ddp", "after_backward")]


def _train(rank: int, world_size: int, init_file: str, out_dir: str, channels_last: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        for precision, reduction in PRECISIONS_AND_REDUCTIONS:  # one process group for all: one spawn's start-up
            torch.manual_seed(5 + rank)  # each rank its own initial weights: both modes start from rank 0's
            network = build_network("DARTS_V2", neuron=NeuronFactory("st_bif_qann", timesteps=1), channels=4,
                                    layers=3, num_classes=10, auxiliary=True, image_size=16)
            trainer = Retrainer(network, optimizer=functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
                                scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=2),
                                epochs=2, auxiliary_weight=0.4, drop_path_prob=0.0, grad_clip=0.5, precision=precision,
                                ctx=DistributedContext(torch.device("cpu"), rank=rank, world_size=world_size),
                                log_every_n_steps=10, channels_last=channels_last, grad_reduction=reduction)
            assert (trainer.flat_grads is not None) == (reduction == "after_backward")
            generator = torch.Generator().manual_seed(rank)  # each rank its own data
            trainer.model.train()
            losses = []
            for _ in range(3):
                images = torch.randn(6, 3, 16, 16, generator=generator)
                labels = torch.randint(0, 10, (6,), generator=generator)
                loss, _ = trainer.eager_step(trainer._to_device(images), labels)
                losses.append(float(loss))
            trainer.evaluate([(torch.randn(4, 3, 16, 16, generator=generator), torch.arange(4))])
            torch.save({"losses": losses, "state": network.state_dict()}, f"{out_dir}/{precision}_{reduction}{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_flat_reduction_trains_as_ddp_in_fp32_and_fp16(tmp_path: Path) -> None:
    channels_last = True  # the flat buffer's views take the weights' NHWC strides (NCHW is the plain case)
    mp.spawn(_train, args=(2, str(tmp_path / "rendezvous"), str(tmp_path), channels_last), nprocs=2, join=True)
    for precision in ("fp32", "fp16"):
        runs = {reduction: [torch.load(tmp_path / f"{precision}_{reduction}{rank}.pt", weights_only=True)
                            for rank in range(2)] for reduction in ("ddp", "after_backward")}
        try:
            assert_trains_as_ddp(runs["ddp"], runs["after_backward"], rtol=1e-5, atol=1e-6)
        except AssertionError as error:
            raise AssertionError(f"{precision}: {error}") from error
