"""train.py stopped by SIGINT in the middle of an epoch and resumed ends exactly where an
uninterrupted run ends (same weights, same metrics), on the CPU with the same seed."""
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from aso_se.run.checkpoint import load_checkpoint
from aso_se.train.retrain import Retrainer
from tests.aso_se.run.helpers import SMOKE, RunApp

TRAIN = [*SMOKE, "genotype=DARTS_V2", "epochs=2"]  # 2 epochs of 4 steps


def _interrupt_at_step(step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Send this process SIGINT during the ``step``-th training step (1-based)."""
    real_step = Retrainer._train_step
    steps = 0

    def train_step(self, inputs, labels):
        nonlocal steps
        steps += 1
        if steps == step:
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, inputs, labels)

    monkeypatch.setattr(Retrainer, "_train_step", train_step)


def test_sigint_mid_epoch_then_resume_equals_uninterrupted(
        run_app: RunApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, stderr = run_app("train", *TRAIN, "hydra.run.dir=straight")
    assert code == 0, stderr

    with monkeypatch.context() as interrupt:
        _interrupt_at_step(6, interrupt)  # epoch 2, step 2 of 4
        code, stderr = run_app("train", *TRAIN, "hydra.run.dir=stopped")
    assert code == 128 + signal.SIGINT and "resume=" in stderr
    saved = load_checkpoint(tmp_path / "stopped" / "checkpoints" / "last.pt", kind="train")
    assert (saved["trainer"]["epoch"], saved["trainer"]["step_in_epoch"]) == (1, 2)

    code, stderr = run_app("train", f"resume={tmp_path / 'stopped'}")
    assert code == 0, stderr
    straight, resumed = (load_checkpoint(tmp_path / run / "checkpoints" / "last.pt", kind="train")
                         for run in ("straight", "stopped"))
    for name, weight in straight["trainer"]["model"].items():
        assert torch.equal(weight, resumed["trainer"]["model"][name]), name
    metrics = [json.loads((tmp_path / run / "metrics.json").read_text())
               for run in ("straight", "stopped")]
    assert metrics[0]["test_loss"] == metrics[1]["test_loss"]
    assert metrics[0]["test_acc"] == metrics[1]["test_acc"]
