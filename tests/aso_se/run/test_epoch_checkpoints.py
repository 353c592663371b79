"""trainer.checkpoint_every_n_epochs: which epoch ends save last.pt (in the background), and that the run's end
still leaves its final state."""
from __future__ import annotations

from pathlib import Path

import pytest

from aso_se.run import lifecycle
from aso_se.run.checkpoint import load_checkpoint
from tests.aso_se.run.helpers import SMOKE, RunApp


@pytest.fixture
def saves(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, bool]]:
    """(file name, epochs done, background) of every Run.save."""
    recorded: list[tuple[str, int, bool]] = []
    real = lifecycle.Run.save

    def save(self, state, path=None, *, background=False):
        done = state["engine"]["position"] if "engine" in state else state.get("trainer", state).get("epoch")
        recorded.append(((path or self.checkpoint_path).name, done, background))
        return real(self, state, path, background=background)

    monkeypatch.setattr(lifecycle.Run, "save", save)
    return recorded


def test_a_retrain_saves_every_n_epochs_and_its_last(run_app: RunApp, tmp_path: Path,
                                                     saves: list[tuple[str, int, bool]]) -> None:
    """(Every epoch, the default, is what test_disk_full's retrain counts on.)"""
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=3", "trainer.checkpoint_every_min=null",
                           "trainer.checkpoint_every_n_epochs=2", "hydra.run.dir=run")
    assert code == 0, stderr
    assert [(done, background) for name, done, background in saves if name == "last.pt"] == [(2, True), (3, True)]
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", kind="train")["trainer"]["epoch"] == 3


def test_a_search_saves_every_n_epochs_and_at_its_end(run_app: RunApp, tmp_path: Path,
                                                      saves: list[tuple[str, int, bool]]) -> None:
    """One cycle of 2 warm-up epochs and a search epoch: its plan is epoch 1, epoch 2, epoch 3, evolution."""
    code, stderr = run_app("search", *SMOKE, "search.schedule.cycles=1", "search.schedule.warmup_epochs=2",
                           "trainer.checkpoint_every_min=null", "trainer.checkpoint_every_n_epochs=2",
                           "hydra.run.dir=run")
    assert code == 0, stderr
    # plan positions after the save: epoch 2's end (in the background), the run's end after the evolution
    assert saves == [("last.pt", 2, True), ("last.pt", 4, False)]
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", kind="search")["engine"]["position"] == 4
