"""trainer.checkpoint_every_min: a retrain saves mid-epoch on a timer, and a run that dies right after
(SIGKILL, a lost node) resumes from that step and ends exactly where an uninterrupted run ends.

Runs train.py in-process; the search's timed checkpoint is checked end to end with SIGKILL in
test_signals.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aso_se.loop import LoopCallbacks
from aso_se.run import checkpoint_policy
from aso_se.run.checkpoint import load_checkpoint
from aso_se.train.retrain import Retrainer
from tests.aso_se.run.helpers import SMOKE, RunApp

TRAIN = [*SMOKE, "genotype=DARTS_V2", "epochs=2"]  # 2 epochs of 4 steps


class NodeLost(BaseException):
    """The process vanishes mid-step: nothing runs after it, no handler saves anything."""


@pytest.fixture
def timed_saves(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(epoch, step_in_epoch) of every timed save of the retrain."""
    saves: list[tuple[int, int]] = []
    real_fit = Retrainer.fit

    def fit(self: Retrainer, *args, callbacks: LoopCallbacks, **kwargs) -> bool:
        inner = callbacks.save_checkpoint

        def save() -> None:
            saves.append((self.epoch, self.step_in_epoch))
            inner()

        callbacks.save_checkpoint = save
        return real_fit(self, *args, callbacks=callbacks, **kwargs)

    monkeypatch.setattr(Retrainer, "fit", fit)
    return saves


def _lose_the_node_at_step(step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    real_step, steps = Retrainer._train_step, 0

    def train_step(self, inputs, labels):
        nonlocal steps
        steps += 1
        if steps == step:
            raise NodeLost
        return real_step(self, inputs, labels)

    monkeypatch.setattr(Retrainer, "_train_step", train_step)


def test_a_timed_checkpoint_resumes_at_its_step(run_app: RunApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                timed_saves: list[tuple[int, int]]) -> None:
    code, stderr = run_app("train", *TRAIN, "hydra.run.dir=straight")  # the default: every 10 minutes
    assert code == 0, stderr
    assert timed_saves == []

    with monkeypatch.context() as node:
        _lose_the_node_at_step(7, node)  # epoch 2, step 3 of 4
        with pytest.raises(NodeLost):
            run_app("train", *TRAIN, "trainer.checkpoint_every_min=1e-6", "hydra.run.dir=lost")
    # After every step but an epoch's last (the epoch end saves then).
    assert timed_saves == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]
    saved = load_checkpoint(tmp_path / "lost" / "checkpoints" / "last.pt", kind="train")
    assert (saved["trainer"]["epoch"], saved["trainer"]["step_in_epoch"]) == (1, 2)

    code, stderr = run_app("train", f"resume={tmp_path / 'lost'}")
    assert code == 0, stderr
    straight, resumed = (load_checkpoint(tmp_path / run / "checkpoints" / "last.pt", kind="train")
                         for run in ("straight", "lost"))
    for name, weight in straight["trainer"]["model"].items():
        assert torch.equal(weight, resumed["trainer"]["model"][name]), name
    metrics = [json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("straight", "lost")]
    assert metrics[0]["test_loss"] == metrics[1]["test_loss"]


@pytest.mark.parametrize(("minutes", "saves"), [("10", [(0, 1), (0, 2), (0, 3)]), ("null", [])])
def test_the_interval_in_minutes(run_app: RunApp, monkeypatch: pytest.MonkeyPatch,
                                 timed_saves: list[tuple[int, int]], minutes: str,
                                 saves: list[tuple[int, int]]) -> None:
    """A clock that moves 11 minutes per reading: 10 is due after every step, null never."""
    readings = iter(range(10**6))
    monkeypatch.setattr(checkpoint_policy.time, "monotonic", lambda: 660.0 * next(readings))
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", f"trainer.checkpoint_every_min={minutes}")
    assert code == 0, stderr
    assert timed_saves == saves
