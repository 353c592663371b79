"""A spiking network retrained eagerly on a CUDA GPU learns as it does on the CPU.

Why: in the graphed drop-path test on H200s, the eager twins' losses over two epochs rose as often as the graphed
runs' (RESULTS.md, #42), where the same setup on the CPU falls. A multi-step spiking network is chaotic: weights
perturbed by one part in a million change the CPU's losses by up to a point, so the devices can only be compared
in distribution, over runs from perturbed weights. TF32 on and off tells rounding from a fault of the GPU path.
Run with `pytest -m gpu tests/aso_se/train/test_retrain_devices_gpu.py` on a machine with a GPU."""
import copy
import functools
import statistics

import pytest
import torch

from aso_se.parallel.distributed import DistributedContext
from aso_se.train.retrain import Retrainer
from search_space.network import build_network
from search_space.neurons import NeuronFactory

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

RUNS = 8


class Batches:
    """The retrain loop's loader interface over fixed batches."""

    def __init__(self, batches):
        self.batches = batches

    def set_epoch(self, epoch, start_batch=0):
        assert start_batch == 0

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def second_epoch_loss(network, device, seed):
    """The training loss of epoch 2 (drop-path on) of 12 steps an epoch over one batch, from `network`'s weights
    scaled by 1 + 1e-6 · N(0, 1) (the perturbation drawn from `seed`); the drop-path masks drawn from `seed` too."""
    network = copy.deepcopy(network)
    generator = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.mul_(1 + 1e-6 * torch.randn(parameter.shape, generator=generator))
    data = torch.Generator().manual_seed(4)
    batch = (torch.randn(16, 1, 16, 16, generator=data), torch.randint(0, 10, (16,), generator=data))
    torch.manual_seed(seed)
    trainer = Retrainer(
        network, optimizer=functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=3e-4),
        scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=2), epochs=2,
        auxiliary_weight=0.4, drop_path_prob=0.3, grad_clip=5.0, precision="fp32",
        ctx=DistributedContext(torch.device(device)), log_every_n_steps=100, cuda_graph=False)
    assert trainer.fit(Batches([batch] * 12), Batches([batch]), should_stop=lambda: False,
                       on_epoch_end=lambda is_best: None)
    return trainer.history[1]["train_loss"]


@pytest.mark.parametrize("tf32", [False, True])
def test_gpu_training_loss_falls_as_on_the_cpu(tf32, monkeypatch):
    """Over RUNS perturbed starts each, the GPU's mean second-epoch loss lies within two of the CPU runs' standard
    deviations above the CPU's mean (a GPU path that learns as well passes by four standard errors)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        torch.manual_seed(0)
        network = build_network("DARTS_V2", neuron=NeuronFactory("st_bif", timesteps=2), channels=8, layers=3,
                                num_classes=10, in_channels=1, image_size=16, auxiliary=False)
        losses = {device: [second_epoch_loss(network, device, seed) for seed in range(RUNS)]
                  for device in ("cpu", "cuda")}
    finally:
        torch.set_float32_matmul_precision(previous)
    cpu, gpu = losses["cpu"], losses["cuda"]
    assert statistics.mean(gpu) < statistics.mean(cpu) + 2 * statistics.stdev(cpu), losses
