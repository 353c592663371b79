"""The tiny network the GPU tests train: its two epochs train, and runs differ in their start only when perturbed."""
import math

from tests.aso_se.train.tiny_spiking_network import epoch_losses, tiny_network


def test_a_run_trains_two_epochs():
    losses = epoch_losses(tiny_network(), seed=0, steps=2)
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


def test_runs_differ_in_their_start_only_when_perturbed():
    network = tiny_network()
    unperturbed = [epoch_losses(network, seed, steps=2, perturbation=0.0)[0] for seed in (0, 1)]
    perturbed = [epoch_losses(network, seed, steps=2)[0] for seed in (0, 1)]
    assert unperturbed[0] == unperturbed[1]  # epoch 1 has no drop-path: one start, one trajectory
    assert perturbed[0] != perturbed[1]
