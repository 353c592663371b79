"""Synaptic operations and energy per image of a retrained network, for metrics.json and TensorBoard."""
from __future__ import annotations

import itertools
import logging
from typing import Any, Iterable

import torch
from torch import Tensor, nn

from search_space.energy import count_energy
from search_space.qann import convert_to_snn

log = logging.getLogger(__name__)


@torch.no_grad()
def energy_metrics(network: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], *, device: torch.device,
                   max_batches: int = 4, snn_timesteps: int | None = None, board: Any = None,
                   step: int = 0, spikes_per_step: int = 1) -> dict[str, Any]:
    """Mean SOPs, MACs and energy per image over the first ``max_batches`` batches, in eval mode.

    With ``snn_timesteps`` (a QANN) the counts are those of its ST-BIF SNN run for that many steps
    (``spikes_per_step``: see convert_to_snn).
    """
    model = convert_to_snn(network, snn_timesteps, spikes_per_step) if snn_timesteps else network
    was_training = model.training
    model.eval()
    totals = {"sops": 0.0, "macs": 0.0, "energy": 0.0, "images": 0}
    try:
        for inputs, _ in itertools.islice(batches, max_batches):
            report = count_energy(model, inputs.to(device))
            totals["sops"] += report.sops_per_image * report.images
            totals["macs"] += report.macs_per_image * report.images
            totals["energy"] += report.energy_per_image_uj * report.images
            totals["images"] += report.images
    finally:
        model.train(was_training)
    images = max(totals["images"], 1)
    metrics = {"sops_per_image": totals["sops"] / images, "macs_per_image": totals["macs"] / images,
               "energy_per_image_uj": totals["energy"] / images}
    if board is not None:
        board.scalars("energy", metrics, step)
    log.info("energy per image: %.4g uJ (%.4g SOPs, %.4g MACs; 0.9 pJ/AC, 4.6 pJ/MAC)",
             metrics["energy_per_image_uj"], metrics["sops_per_image"], metrics["macs_per_image"])
    return metrics
