"""train.py's cuda_graph=true on several GPUs (NCCL): the captured step, its gradients all-reduced
between two replays (FlatGradients), trains as eager DDP does: same losses, same weights.
Run with `pytest -m gpu tests/aso_se/train/test_flat_reduction_gpu.py` on a machine with 2 GPUs."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from aso_se.parallel.distributed import DistributedContext
from aso_se.train.retrain import Retrainer
from search_space.network import build_network
from search_space.neurons import NeuronFactory
from tests.aso_se.train.ddp_runs import assert_trains_as_ddp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]
STEPS = 8  # GraphedTrainStep's warm-up steps, the capture, then replays


def _train(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    torch.cuda.set_device(rank)
    torch.backends.cudnn.allow_tf32 = False  # both arms in full fp32, so rounding alone separates them
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        for cuda_graph in (False, True):  # eager DDP, then the graphs with the flat reduction
            torch.manual_seed(5 + rank)  # each rank its own initial weights: both arms start from rank 0's
            # cuDNN convs, as the fast recipe: "auto" may take the sparse kernels (TF32) inside the capture
            # only, and a first run with it differed from eager DDP from the captured step on (2 H200).
            network = build_network("DARTS_V2", neuron=NeuronFactory("st_bif_qann", timesteps=1), channels=8,
                                    layers=5, num_classes=10, auxiliary=True, image_size=32, conv_backend="torch")
            sgd = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True, fused=True)
            trainer = Retrainer(network, optimizer=sgd,
                                scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=2),
                                epochs=2, auxiliary_weight=0.4, drop_path_prob=0.0, grad_clip=5.0, precision="fp32",
                                ctx=DistributedContext(torch.device("cuda", rank), rank=rank, world_size=world_size),
                                log_every_n_steps=10, cuda_graph=cuda_graph, channels_last=True,
                                label_smoothing=0.1)
            assert (trainer.flat_grads is not None) == cuda_graph
            step = trainer.graphed_step if cuda_graph else trainer.eager_step
            generator = torch.Generator().manual_seed(rank)  # each rank its own data
            trainer.model.train()
            losses = []
            for _ in range(STEPS):
                images = torch.randn(16, 3, 32, 32, generator=generator)
                labels = torch.randint(0, 10, (16,), generator=generator).cuda()
                loss, _ = step(trainer._to_device(images.cuda()), labels)
                losses.append(loss.item())  # read before the next replay overwrites it
            if cuda_graph:
                assert trainer.graphed_step.replays > 0
            # The evaluation gives every rank rank 0's batch-norm statistics, as DDP does before each forward
            # (the flat reduction's ranks keep their own until then).
            trainer.evaluate([(torch.randn(4, 3, 32, 32, generator=generator).cuda(), torch.arange(4).cuda())])
            state = {name: value.cpu() for name, value in network.state_dict().items()}
            torch.save({"losses": losses, "state": state}, f"{out_dir}/{'graph' if cuda_graph else 'ddp'}{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_graphs_with_the_flat_reduction_train_as_eager_ddp_on_two_gpus(tmp_path: Path) -> None:
    mp.spawn(_train, args=(2, str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=2, join=True)
    runs = {arm: [torch.load(tmp_path / f"{arm}{rank}.pt", weights_only=True) for rank in range(2)]
            for arm in ("ddp", "graph")}
    assert len(set(runs["ddp"][0]["losses"])) == STEPS  # the batches and the weights moved
    assert_trains_as_ddp(runs["ddp"], runs["graph"], rtol=1e-4, atol=1e-5)
