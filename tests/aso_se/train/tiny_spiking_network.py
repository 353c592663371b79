"""A tiny spiking DARTS_V2 (ST-BIF, T = 2, 16x16 inputs) and its two-epoch retrain on one fixed batch: what the GPU
tests of the neurons and of the retrain devices train, small enough to run in seconds."""
from __future__ import annotations

import copy
import functools

import torch

from aso_se.parallel.distributed import DistributedContext
from aso_se.train.retrain import Retrainer
from search_space.network import build_network
from search_space.neurons import NeuronFactory


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
