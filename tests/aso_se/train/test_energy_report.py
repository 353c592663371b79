"""The energy report counts the same first images whatever the loader's batch and its own chunk."""
from __future__ import annotations

import pytest
import torch

from aso_se.train import energy_report
from aso_se.train.energy_report import energy_metrics, image_chunks
from tests.search_space.test_qann import ALL_OPS, qann_network


def _batches(x: torch.Tensor, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(piece, torch.zeros(piece.shape[0], dtype=torch.long)) for piece in torch.split(x, batch)]


def test_image_chunks_yield_the_first_images_in_bounded_pieces() -> None:
    x = torch.randn(23, 2, 3, 3)
    pieces = list(image_chunks(_batches(x, 7), images=17, chunk=4))
    assert max(p.shape[0] for p in pieces) <= 4
    assert torch.equal(torch.cat(pieces), x[:17])
    assert torch.equal(torch.cat(list(image_chunks(_batches(x, 5), images=100, chunk=3))), x)
    assert list(image_chunks(_batches(x, 5), images=0, chunk=3)) == []


def test_energy_is_the_same_for_any_loader_batch_and_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    network = qann_network(ALL_OPS, seed=5, level=4, sym=False).double()
    x = torch.randn(11, 2, 12, 12, dtype=torch.float64)
    seen: list[int] = []
    count = energy_report.count_energy

    def counting(model, inputs, **kwargs):
        seen.append(inputs.shape[0])
        return count(model, inputs, **kwargs)

    monkeypatch.setattr(energy_report, "count_energy", counting)
    whole = energy_metrics(network, _batches(x, 11), device=torch.device("cpu"), images=9, chunk=9,
                           snn_timesteps=24)
    assert seen == [9]
    seen.clear()
    pieces = energy_metrics(network, _batches(x, 4), device=torch.device("cpu"), images=9, chunk=2,
                            snn_timesteps=24)
    assert seen == [2, 2, 2, 2, 1]  # batches 4, 4, 1 of the 9 images, at most 2 at a time
    assert whole["sops_per_image"] > 0 and whole["macs_per_image"] > 0
    for key in whole:
        assert pieces[key] == pytest.approx(whole[key], rel=1e-9)
    first_five = energy_metrics(network, _batches(x, 11), device=torch.device("cpu"), images=5, snn_timesteps=24)
    assert first_five["sops_per_image"] != pytest.approx(whole["sops_per_image"], rel=1e-9)  # other images count
