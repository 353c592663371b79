"""What a retrain's checkpoint carries from one piece of a run to the next."""
import functools

import torch

from aso_se.parallel.distributed import DistributedContext
from aso_se.train.retrain import Retrainer
from search_space.network import build_network
from search_space.neurons import NeuronFactory


def cpu_trainer() -> Retrainer:
    torch.manual_seed(0)
    network = build_network("DARTS_V2", neuron=NeuronFactory("st_bif_qann", timesteps=1), channels=4, layers=3,
                            num_classes=10, in_channels=1, image_size=16, auxiliary=False)
    return Retrainer(network, optimizer=functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
                     scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=2), epochs=2,
                     auxiliary_weight=0.0, drop_path_prob=0.0, grad_clip=5.0, precision="fp32",
                     ctx=DistributedContext(torch.device("cpu")), log_every_n_steps=10)


def test_the_gpu_memory_peak_of_earlier_pieces_is_kept_across_resumes():
    """A resumed piece that only evaluates the SNN peaks lower than the training pieces did: metrics.json
    reports the run's peak, carried through each checkpoint, not the last piece's."""
    first = cpu_trainer()
    assert first.peak_gpu_memory_gib() is None  # no CUDA device, no earlier piece
    state = first.state_dict()
    state["peak_gpu_memory_gib"] = 34.5  # as a training piece on a GPU saved it
    second = cpu_trainer()
    second.load_state_dict(state)
    third = cpu_trainer()
    third.load_state_dict(second.state_dict())
    assert third.peak_gpu_memory_gib() == 34.5
    del state["peak_gpu_memory_gib"]  # a checkpoint written before the peak was carried
    older = cpu_trainer()
    older.load_state_dict(state)
    assert older.peak_gpu_memory_gib() is None
