"""The tiny network the GPU tests train: its two epochs train, and runs differ in their start only when perturbed."""
import functools
import math

import torch

from aso_se.parallel.distributed import DistributedContext
from aso_se.train.retrain import Retrainer
from search_space.neurons import SpikingNeuron
from tests.aso_se.train.tiny_spiking_network import _Batches, epoch_losses, tiny_network


def test_a_run_trains_two_epochs():
    losses = epoch_losses(tiny_network(), seed=0, steps=2)
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


def test_runs_differ_in_their_start_only_when_perturbed():
    network = tiny_network()
    unperturbed = [epoch_losses(network, seed, steps=2, perturbation=0.0)[0] for seed in (0, 1)]
    perturbed = [epoch_losses(network, seed, steps=2)[0] for seed in (0, 1)]
    assert unperturbed[0] == unperturbed[1]  # epoch 1 has no drop-path: one start, one trajectory
    assert perturbed[0] != perturbed[1]


def test_training_steps_count_no_spikes_and_the_test_pass_reports_the_rates(monkeypatch):
    """Counting spikes is a reduction in every neuron forward: a retrain counts them in its test pass only."""
    counted = []
    original = SpikingNeuron._run

    def run(self, x, with_block_map):
        counted.append((self.training, self.record_firing_rate))
        return original(self, x, with_block_map)

    monkeypatch.setattr(SpikingNeuron, "_run", run)
    network = tiny_network()
    trainer = Retrainer(network, optimizer=functools.partial(torch.optim.SGD, lr=0.05),
                        scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=1), epochs=1,
                        auxiliary_weight=0.0, drop_path_prob=0.0, grad_clip=5.0, precision="fp32",
                        ctx=DistributedContext(torch.device("cpu")), log_every_n_steps=100)
    batch = (torch.randn(4, 1, 16, 16), torch.randint(0, 10, (4,)))
    assert trainer.fit(_Batches([batch]), _Batches([batch]))
    assert {recording for training, recording in counted if training} == {False}
    assert {recording for training, recording in counted if not training} == {True}
    rates = trainer.last_test["firing_rates"]
    assert rates and all(0 <= rate <= 1 for rate in rates.values()) and any(rate > 0 for rate in rates.values())
    assert not any(neuron.record_firing_rate for neuron in network.modules() if isinstance(neuron, SpikingNeuron))
