"""train.py snn_finetune.early_timesteps: one fine-tuning that trains the SNN's answers at two T."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from aso_se.run import errors
from aso_se.run.checkpoint import load_checkpoint
from tests.aso_se.run.helpers import SMOKE, RunApp


def test_a_fine_tune_with_an_early_readout_reports_both_timesteps(run_app: RunApp, tmp_path: Path) -> None:
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann", "neuron.level=4",
                           "snn_max_timesteps=4", "snn_finetune.epochs=1", "snn_finetune.timesteps=4",
                           "snn_finetune.early_timesteps=2", "snn_finetune.early_weight=0.5", "hydra.run.dir=run")
    assert code == 0, stderr
    finetuned = json.loads((tmp_path / "run" / "metrics.json").read_text())["snn_finetune"]
    assert (finetuned["early_timesteps"], finetuned["early_weight"]) == (2, 0.5)
    assert {"2", "4"} <= set(finetuned["acc_at_t"]) and finetuned["test_acc"] == finetuned["acc_at_t"]["4"]
    assert "SNN fine-tune (T = 4, also 2)" in (tmp_path / "run" / "train.log").read_text()


def test_an_early_readout_not_before_t_is_refused_in_one_line(run_app: RunApp, tmp_path: Path) -> None:
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann", "neuron.level=4",
                           "snn_finetune.epochs=1", "snn_finetune.timesteps=4", "snn_finetune.early_timesteps=4",
                           "hydra.run.dir=run")
    last_line = stderr.strip().splitlines()[-1]
    assert code != 0 and "snn_finetune.early_timesteps=4 must be an integer from 1 to" in last_line
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before the QANN trained


def test_a_fine_tune_with_its_own_batch_size(run_app: RunApp, tmp_path: Path) -> None:
    """snn_finetune.batch_size: BPTT keeps T steps of activations, so the fine-tuning may take smaller batches than
    the QANN: its epoch takes as many more steps."""
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann", "neuron.level=4",
                           "snn_max_timesteps=4", "batch_size=64", "data.max_train_samples=256",
                           "snn_finetune.epochs=1", "snn_finetune.timesteps=2", "snn_finetune.batch_size=32",
                           "hydra.run.dir=run")
    assert code == 0, stderr
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", kind="train")
    assert state["trainer"]["global_step"] == 256 // 64
    assert state["snn_trainer"]["global_step"] == 256 // 64 + 256 // 32


def test_out_of_memory_in_the_fine_tuning_names_its_knobs_and_the_resume_keeps_the_qann(
        run_app: RunApp, tmp_path: Path, monkeypatch) -> None:
    """BPTT holds T steps of activations, so the fine-tuning may run out of memory where the QANN did not: the line
    names snn_finetune's knobs and the resume, which goes on from the trained QANN (its epochs are not redone)."""
    from aso_se.train.retrain import Retrainer
    fit = Retrainer.fit

    def out_of_memory_in_bptt(self, *args, **kwargs):
        if self.label.startswith("SNN fine-tune"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(Retrainer, "fit", out_of_memory_in_bptt)
    overrides = (*SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann", "neuron.level=4",
                 "snn_max_timesteps=4", "snn_finetune.epochs=1", "snn_finetune.timesteps=2")
    code, stderr = run_app("train", *overrides, "snn_finetune.batch_size=32", "hydra.run.dir=run")
    assert code == errors.EXIT_OUT_OF_MEMORY
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("error: out of GPU memory in the SNN fine-tuning (BPTT holds T = 2 steps")
    assert "of 32 images a process); lower snn_finetune.batch_size or snn_finetune.timesteps" in line
    resume = line.split("go on from the trained QANN: ")[1]
    assert resume == f"python train.py resume={tmp_path / 'run'} snn_finetune.batch_size=16"
    qann_steps = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", kind="train")["trainer"]["global_step"]
    monkeypatch.setattr(Retrainer, "fit", fit)
    code, stderr = run_app("train", *resume.split()[2:])
    assert code == 0, stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["snn_finetune"]["batch_size"] == 16 and "pending" not in metrics
    assert [record["epoch"] for record in metrics["history"]] == [0]  # the QANN's one epoch, not redone
    assert qann_steps > 0
