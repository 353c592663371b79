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
import torch.nn.functional as F

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


def network_step(network, images, labels, seed):
    """One training-mode forward and backward at drop-path 0.5 (masks drawn from `seed`): loss and gradients."""
    network.train()
    network.drop_path_prob = 0.5
    torch.manual_seed(seed)
    logits, _ = network(images)
    loss = F.cross_entropy(logits, labels)
    network.zero_grad(set_to_none=True)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in network.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "cl"])
def test_node_sum_kernels_in_a_network_equal_torch_ops(channels_last, no_tf32, monkeypatch):
    """The cells' node sums and concatenations on the kernels (kernels/drop_path_sum, "auto" on CUDA) against
    PyTorch's ops in the same network on the same GPU. At drop-path 0.5 the scales are 0 and 2, so every product
    is exact and both paths compute the same sums: equal losses and gradients, masks and all."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    torch.manual_seed(0)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    network = build_network("DARTS_V2", neuron=NeuronFactory("st_bif", timesteps=2), channels=8, layers=3,
                            num_classes=10, in_channels=1, image_size=16, auxiliary=False).cuda()
    network = network.to(memory_format=layout)
    twin = copy.deepcopy(network)
    cells = [module for module in twin.modules() if hasattr(module, "drop_path_backend")]
    assert cells
    for cell in cells:
        cell.drop_path_backend = "torch"
    data = torch.Generator().manual_seed(4)
    images = torch.randn(16, 1, 16, 16, generator=data).cuda().contiguous(memory_format=layout)
    labels = torch.randint(0, 10, (16,), generator=data).cuda()
    for seed in (0, 1):
        (loss, grads), (want_loss, want_grads) = (network_step(net, images, labels, seed) for net in (network, twin))
        assert loss.item() == pytest.approx(want_loss.item(), rel=1e-6, abs=0), seed
        assert grads.keys() == want_grads.keys()
        # gradients summed in another order: a threshold's (a sum over its neurons' terms) moves most
        errors = {name: ((grad - want_grads[name]).norm() / want_grads[name].norm().clamp_min(1e-30)).item()
                  for name, grad in grads.items()}
        assert max(errors.values()) < 1e-4, sorted(errors.items(), key=lambda item: -item[1])[:3]
