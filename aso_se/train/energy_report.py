"""Synaptic operations and energy per image of a retrained network, for metrics.json and TensorBoard."""
from __future__ import annotations

import logging
from typing import Any, Iterable, Iterator

import torch
from torch import Tensor, nn

from search_space.energy import count_energy
from search_space.qann import convert_to_snn

log = logging.getLogger(__name__)


def image_chunks(batches: Iterable[tuple[Tensor, Tensor]], images: int, chunk: int) -> Iterator[Tensor]:
    """The first ``images`` inputs of ``batches`` in pieces of at most ``chunk``, whatever the loader's batch size."""
    left = images
    if left <= 0:
        return
    for inputs, _ in batches:
        for piece in torch.split(inputs[:left], chunk):
            yield piece
        left -= min(left, inputs.shape[0])
        if left == 0:
            return


@torch.no_grad()
def energy_metrics(network: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], *, device: torch.device,
                   images: int = 1024, chunk: int = 128, snn_timesteps: int | None = None, board: Any = None,
                   step: int = 0, spikes_per_step: int = 1) -> dict[str, Any]:
    """Mean SOPs, MACs and energy per image over the first ``images`` test images, in eval mode.

    With ``snn_timesteps`` (a QANN) the counts are those of its ST-BIF SNN run for that many steps
    (``spikes_per_step``: see convert_to_snn). The SNN holds every step of a layer at once, so the images go
    ``chunk`` at a time: a one-GPU run's training batch at all its steps did not fit in an H200's memory.
    """
    model = convert_to_snn(network, snn_timesteps, spikes_per_step) if snn_timesteps else network
    was_training = model.training
    model.eval()
    totals = {"sops": 0.0, "macs": 0.0, "energy": 0.0, "images": 0}
    try:
        for inputs in image_chunks(batches, images, chunk):
            report = count_energy(model, inputs.to(device))
            totals["sops"] += report.sops_per_image * report.images
            totals["macs"] += report.macs_per_image * report.images
            totals["energy"] += report.energy_per_image_uj * report.images
            totals["images"] += report.images
    finally:
        model.train(was_training)
    counted = max(totals["images"], 1)
    metrics = {"sops_per_image": totals["sops"] / counted, "macs_per_image": totals["macs"] / counted,
               "energy_per_image_uj": totals["energy"] / counted}
    if board is not None:
        board.scalars("energy", metrics, step)
    log.info("energy per image: %.4g uJ (%.4g SOPs, %.4g MACs; 0.9 pJ/AC, 4.6 pJ/MAC)",
             metrics["energy_per_image_uj"], metrics["sops_per_image"], metrics["macs_per_image"])
    return metrics
