"""train.py init_from= / threshold_init=lsq: a QANN retrain started from a finished ReLU run and its first batch."""
from __future__ import annotations

from pathlib import Path

import torch

from aso_se.run.checkpoint import load_checkpoint
from tests.aso_se.run.helpers import SMOKE, RunApp

QANN = [*SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann", "neuron.level=4", "snn_max_timesteps=4"]


def test_a_qann_started_from_a_relu_run_with_lsq_thresholds(run_app: RunApp, tmp_path: Path) -> None:
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=relu", "hydra.run.dir=relu")
    assert code == 0, stderr
    code, stderr = run_app("train", *QANN, f"init_from={tmp_path / 'relu'}", "threshold_init=lsq",
                           "optim.optimizer.lr=1e-12", "optim.optimizer.weight_decay=0", "hydra.run.dir=qann")
    assert code == 0, stderr
    log = (tmp_path / "qann" / "train.log").read_text()
    assert "tensors copied" in log and "quantizer thresholds set from the first training batch" in log
    relu, qann = (load_checkpoint(tmp_path / run / "checkpoints" / "last.pt", kind="train")["trainer"]["model"]
                  for run in ("relu", "qann"))
    convs = [name for name, tensor in relu.items() if name.endswith("weight") and tensor.dim() == 4]
    assert convs and all(torch.allclose(qann[name], relu[name], atol=1e-6) for name in convs)
    thetas = {round(tensor.item(), 4) for name, tensor in qann.items() if name.endswith("q_threshold")}
    assert len(thetas) > 3  # read off the batch, not the configured one for all


def test_a_missing_init_from_is_refused_in_one_line_before_any_training(run_app: RunApp, tmp_path: Path) -> None:
    code, stderr = run_app("train", *QANN, f"init_from={tmp_path / 'nowhere'}", "hydra.run.dir=run")
    assert code != 0
    assert "init_from=" in stderr.strip().splitlines()[-1] and "no such checkpoint" in stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
    code, stderr = run_app("train", *QANN, "threshold_init=percentile", "hydra.run.dir=run2")
    assert code != 0 and "threshold_init='percentile': use one of config, lsq" in stderr


def test_a_qann_distilled_from_a_relu_run(run_app: RunApp, tmp_path: Path) -> None:
    """distill.teacher=<ReLU run>: the QANN trains on the blended loss (the teacher frozen, rebuilt from its run);
    a missing teacher is refused before any training."""
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=relu", "hydra.run.dir=relu")
    assert code == 0, stderr
    code, stderr = run_app("train", *QANN, f"distill.teacher={tmp_path / 'relu'}", "distill.weight=0.7",
                           "hydra.run.dir=qann")
    assert code == 0, stderr
    log = (tmp_path / "qann" / "train.log").read_text()
    assert "distill: teacher" in log and "(relu neurons), weight 0.7" in log
    code, stderr = run_app("train", *QANN, f"distill.teacher={tmp_path / 'nowhere'}", "hydra.run.dir=run")
    assert code != 0 and "distill.teacher=" in stderr.strip().splitlines()[-1]
    assert not (tmp_path / "run" / "checkpoints").exists()
