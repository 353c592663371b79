"""trainer.checkpoint_every_n_epochs: which epoch ends save last.pt (in the background), and that the run's end
still leaves its final state."""
from __future__ import annotations

from pathlib import Path

import pytest

from aso_se.run import app
from aso_se.run.checkpoint import load_checkpoint
from tests.aso_se.run.helpers import SMOKE, RunApp


@pytest.fixture
def saves(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, bool]]:
    """(file name, epochs done, background) of every Run.save."""
    recorded: list[tuple[str, int, bool]] = []
    real = app.Run.save

    def save(self, state, path=None, *, background=False):
        done = state["engine"]["position"] if "engine" in state else state.get("trainer", state).get("epoch")
        recorded.append(((path or self.checkpoint_path).name, done, background))
        return real(self, state, path, background=background)

    monkeypatch.setattr(app.Run, "save", save)
    return recorded


@pytest.mark.parametrize("every", [1, 2])
def test_a_retrain_saves_every_n_epochs_and_its_last(run_app: RunApp, tmp_path: Path, every: int,
                                                     saves: list[tuple[str, int, bool]]) -> None:
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=3", "trainer.checkpoint_every_min=null",
                           f"trainer.checkpoint_every_n_epochs={every}", "hydra.run.dir=run")
    assert code == 0, stderr
    last = [(done, background) for name, done, background in saves if name == "last.pt"]
    assert last == ([(1, True), (2, True), (3, True)] if every == 1 else [(2, True), (3, True)])
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", kind="train")["trainer"]["epoch"] == 3


def test_a_search_saves_every_n_epochs_and_at_its_end(run_app: RunApp, tmp_path: Path,
                                                      saves: list[tuple[str, int, bool]]) -> None:
    """The smoke search's plan: search epoch 1, evolution, re-stabilization epoch 2, search epoch 3, evolution."""
    code, stderr = run_app("search", *SMOKE, "trainer.checkpoint_every_min=null", "trainer.checkpoint_every_n_epochs=2",
                           "hydra.run.dir=run")
    assert code == 0, stderr
    # plan positions after the save: epoch 2 ends at position 3 (epoch 1, evolution, epoch 2), the run's end at 5
    assert saves == [("last.pt", 3, True), ("last.pt", 5, False)]
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", kind="search")["engine"]["position"] == 5
