"""TensorBoard output read back with tensorboard's own EventAccumulator."""
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from aso_se.monitor.tensorboard import TensorBoardLogger, edge_labels, layer_of
from search_space.errors import UserInputError
from search_space.genotypes import GENOTYPES

PRIMITIVES = ["none", "max_pool_3x3", "avg_pool_3x3", "skip_connect", "sep_conv_3x3",
              "sep_conv_5x5", "dil_conv_3x3", "dil_conv_5x5"]


def _events(log_dir: Path) -> EventAccumulator:
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0, "histograms": 0})
    events.Reload()
    return events


def test_everything_logged_can_be_read_back(tmp_path: Path) -> None:
    board = TensorBoardLogger(tmp_path)
    board.scalars("train", {"loss": 2.3, "acc": 0.1}, step=3)
    alphas = {"normal": torch.randn(14, 8).softmax(-1), "reduce": torch.randn(14, 8).softmax(-1)}
    board.alphas(alphas, PRIMITIVES, step=3)
    board.genotype(GENOTYPES["DARTS_V2"], step=3)
    board.firing_rates({"cells.0.op.0": 0.1, "cells.0.op.1": 0.3, "cells.1.op": 0.2, "stem": 0.5},
                       step=3)
    board.sparse_conv_paths({"sparse": 4, "dense": 9}, step=3)
    board.close()

    events = _events(tmp_path)
    tags = events.Tags()
    assert events.Scalars("train/loss")[0].value == pytest.approx(2.3)
    assert events.Scalars("firing_rate_mean/cells.0")[0].value == pytest.approx(0.2)
    assert events.Scalars("sparse_conv/dense")[0].value == 9
    images = {"alpha/normal", "alpha/reduce", "genotype/normal", "genotype/reduce"}
    assert images <= set(tags["images"])
    image = events.Images("alpha/normal")[0]
    assert image.width > 200 and image.height > 200 and image.encoded_image_string[:4] == b"\x89PNG"
    assert {"firing_rate/cells.0", "firing_rate/cells.1", "firing_rate/stem",
            "firing_rate/all"} <= set(tags["histograms"])
    assert events.Histograms("firing_rate/all")[0].histogram_value.num == 4
    assert "sep_conv_3x3" in str(events.Tensors("genotype/text_summary")[0].tensor_proto)


def test_alpha_figures_are_due_every_n_epochs_and_a_bad_n_is_refused(tmp_path: Path) -> None:
    board = TensorBoardLogger(tmp_path, alpha_figure_every_n_epochs=3)
    assert [epoch for epoch in range(9) if board.alpha_figure_due(epoch)] == [2, 5, 8]
    assert all(TensorBoardLogger(tmp_path / "every").alpha_figure_due(epoch) for epoch in range(4))
    with pytest.raises(UserInputError, match="alpha_figure_every_n_epochs=0: need an int >= 1"):
        TensorBoardLogger(tmp_path / "bad", alpha_figure_every_n_epochs=0)
    assert not (tmp_path / "bad").exists()


def test_purge_step_drops_events_after_the_resumed_checkpoint(tmp_path: Path) -> None:
    board = TensorBoardLogger(tmp_path)
    for step in range(10):
        board.scalars("train", {"loss": float(step)}, step)
    board.close()
    # Event files are read in name order, which starts with the second and then a per-process counter that sorts
    # "10" before "9": the resumed writer starts in a later second, as a resumed run does.
    time.sleep(1.01 - time.time() % 1)
    resumed = TensorBoardLogger(tmp_path, purge_step=5)  # the checkpoint was taken at step 5
    resumed.scalars("train", {"loss": -1.0}, 5)
    resumed.close()
    steps = [(event.step, event.value) for event in _events(tmp_path).Scalars("train/loss")]
    assert steps == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, -1.0)]


def test_edge_labels_follow_darts_edge_order() -> None:
    labels = edge_labels(14)
    assert labels[:5] == ["c_{k-2} → 0", "c_{k-1} → 0", "c_{k-2} → 1", "c_{k-1} → 1",
                          "0 → 1"]
    assert labels[-1] == "2 → 3" and len(labels) == 14
    with pytest.raises(ValueError, match="not a DARTS cell"):
        edge_labels(13)


def test_layer_of_groups_neurons_by_cell() -> None:
    assert layer_of("cells.3.edges.2.op.1") == "cells.3"
    assert layer_of("auxiliary_head.features.0") == "auxiliary_head.features.0"
    assert layer_of("stem") == "stem"
