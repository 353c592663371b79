"""train.py stopped by SIGINT in the middle of an epoch and resumed ends exactly where an
uninterrupted run ends (same weights, same metrics), on the CPU with the same seed."""
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from aso_se.run import train_callbacks
from aso_se.run.checkpoint import load_checkpoint
from aso_se.train import snn_eval
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


@pytest.mark.slow
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


def test_a_retrain_in_pieces_each_resumed_from_a_copied_run_dir_equals_uninterrupted(
        run_app: RunApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long run cut into pieces, each continued on "another machine": the run dir copied elsewhere (the old one
    deleted, so nothing may point back to it) and resumed there; the last piece ends as the uninterrupted run."""
    code, stderr = run_app("train", *TRAIN, "hydra.run.dir=straight")
    assert code == 0, stderr
    with monkeypatch.context() as interrupt:
        _interrupt_at_step(3, interrupt)  # epoch 1, step 3 of 4
        code, stderr = run_app("train", *TRAIN, "hydra.run.dir=piece1")
    assert code == 128 + signal.SIGINT, stderr
    run_dir = tmp_path / "piece1"
    for piece in (2, 3):
        moved = tmp_path / f"machine{piece}" / "run"
        shutil.copytree(run_dir, moved)
        shutil.rmtree(run_dir)
        run_dir = moved
        with monkeypatch.context() as interrupt:
            if piece == 2:
                _interrupt_at_step(3, interrupt)  # epoch 2, step 2: a stop inside the resumed epoch
            machine = ["data.num_workers=1"] if piece == 3 else []  # a setting of the new machine
            code, stderr = run_app("train", f"resume={run_dir}", *machine)
        assert code == (128 + signal.SIGINT if piece == 2 else 0), stderr
    straight, pieces = (load_checkpoint(run / "checkpoints" / "last.pt", kind="train")
                        for run in (tmp_path / "straight", run_dir))
    assert (pieces["trainer"]["epoch"], pieces["trainer"]["global_step"]) == (2, 8)
    for name, weight in straight["trainer"]["model"].items():
        assert torch.equal(weight, pieces["trainer"]["model"][name]), name
    metrics = [json.loads((run / "metrics.json").read_text()) for run in (tmp_path / "straight", run_dir)]
    assert metrics[0]["test_loss"] == metrics[1]["test_loss"] and metrics[0]["test_acc"] == metrics[1]["test_acc"]
    assert [r["train_loss"] for r in metrics[0]["history"]] == [r["train_loss"] for r in metrics[1]["history"]]


@pytest.mark.slow  # test_checkpoint.py keeps the fallback itself in CI
def test_a_truncated_last_checkpoint_resumes_from_the_one_before_and_ends_as_uninterrupted(
        run_app: RunApp, tmp_path: Path) -> None:
    """trainer.keep_checkpoints=2 (the default): last.pt damaged after the run, the resume says so in one line,
    continues from last.1.pt (the end of epoch 1) and ends with the uninterrupted run's weights."""
    code, stderr = run_app("train", *TRAIN, "trainer.checkpoint_every_min=null", "hydra.run.dir=run")
    assert code == 0, stderr
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    straight = load_checkpoint(last, kind="train")
    assert load_checkpoint(last.with_name("last.1.pt"), kind="train")["trainer"]["epoch"] == 1
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    code, stderr = run_app("train", f"resume={tmp_path / 'run'}")
    assert code == 0, stderr
    log = (tmp_path / "run" / "train.log").read_text()
    assert f"{last} is unreadable" in log and "last.1.pt, the checkpoint saved before it" in log
    resumed = load_checkpoint(last, kind="train")
    for name, weight in straight["trainer"]["model"].items():
        assert torch.equal(weight, resumed["trainer"]["model"][name]), name


def test_sigterm_during_the_snn_evaluation_stops_it_and_resume_redoes_only_the_evaluation(
        run_app: RunApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """neuron=st_bif_qann: after training, the SNN's evaluation (minutes on a CPU) ends at the next batch
    when a stop signal comes; metrics.json already holds the training's figures (evaluations pending), the last
    epoch's checkpoint is kept, and the resumed run only evaluates."""
    qann = [*SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann"]
    real_evaluate = snn_eval.evaluate_snn
    batches_seen = []

    def evaluate_with_a_signal(*args, before_batch, **kwargs):
        def before():
            batches_seen.append(1)
            if len(batches_seen) == 2:  # during the QANN's pass over the test set
                os.kill(os.getpid(), signal.SIGTERM)
            before_batch()

        return real_evaluate(*args, before_batch=before, **kwargs)

    with monkeypatch.context() as interrupt:
        interrupt.setattr(snn_eval, "evaluate_snn", evaluate_with_a_signal)
        code, stderr = run_app("train", *qann, "hydra.run.dir=stopped")
    assert code == 128 + signal.SIGTERM and stderr.count("\n") == 1 and "resume=" in stderr
    assert len(batches_seen) == 2  # no batch ran after the signal
    run_dir = tmp_path / "stopped"
    trained = json.loads((run_dir / "metrics.json").read_text())  # the training's figures, evaluations pending
    assert trained["pending"] == ["snn", "energy"] and "snn_test_acc" not in trained
    assert trained["epochs"] == 1 and len(trained["history"]) == 1 and 0 <= trained["test_acc"] <= 1
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt", kind="train")["trainer"]["epoch"] == 1

    code, stderr = run_app("train", f"resume={run_dir}")
    assert code == 0, stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["snn_silent"] and metrics["snn_test_acc"] == metrics["test_acc"] and "pending" not in metrics
    assert metrics["test_acc"] == trained["test_acc"] and "energy_per_image_uj" in metrics
    assert "retrain epoch" not in (run_dir / "train.log").read_text().split("resumed from")[-1]  # no training


def test_a_host_lost_during_the_energy_report_keeps_the_snn_figures(
        run_app: RunApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """neuron=st_bif_qann: metrics.json is written again once the SNN is evaluated, so a run that dies in the
    energy report (here: the report raises) keeps the SNN's figures with only the energy pending."""
    def energy_dies(*args, **kwargs):
        raise RuntimeError("the host went away")

    monkeypatch.setattr(train_callbacks, "energy_metrics", energy_dies)
    with pytest.raises(RuntimeError, match="the host went away"):
        run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann", "hydra.run.dir=run")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["pending"] == ["energy"] and "energy_per_image_uj" not in metrics
    assert 0 <= metrics["snn_test_acc"] <= 1 and metrics["snn_timesteps"] >= 1 and len(metrics["history"]) == 1


def test_a_resume_may_change_the_snn_evaluation_knobs_alone(run_app: RunApp, tmp_path: Path) -> None:
    """snn_max_timesteps, snn_first_timesteps, snn_eval_samples, snn_eval_dtype and snn_spikes_per_step only change
    the evaluation: a finished QANN run resumed with them evaluates its SNN anew (no training) and rewrites
    metrics.json; other settings are refused."""
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann",
                           "snn_max_timesteps=1", "hydra.run.dir=run")
    assert code == 0, stderr
    run_dir = tmp_path / "run"
    capped = json.loads((run_dir / "metrics.json").read_text())
    assert capped["snn_acc_at_t"].keys() == {"1"} and capped["snn_eval_dtype"] == "float32"

    code, stderr = run_app("train", f"resume={run_dir}", "snn_max_timesteps=256", "snn_eval_samples=20",
                           "snn_eval_dtype=float64")
    assert code == 0, stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["snn_eval_dtype"] == "float64" and metrics["snn_silent"] and len(metrics["snn_acc_at_t"]) > 1
    assert metrics["snn_prediction_agreement"] == 1.0 and metrics["test_acc"] == capped["test_acc"]
    assert "retrain epoch" not in (run_dir / "train.log").read_text().split("resumed from")[-1]  # no training

    code, stderr = run_app("train", f"resume={run_dir}", "snn_eval_dtype=float64", "epochs=3")
    assert code != 0 and "drop the overrides epochs=3" in stderr
    assert ("a resume takes only data.root, data.num_workers, snn_max_timesteps, snn_first_timesteps, "
            "snn_eval_samples, snn_eval_dtype") in stderr


@pytest.mark.slow  # CI keeps the knobs test above and the graded neuron's own tests
def test_a_resume_may_switch_a_finished_qann_run_to_graded_spikes(run_app: RunApp, tmp_path: Path) -> None:
    """Up to 15 spikes a step (the default 16 levels): the same SNN accuracy as the binary SNN, after one step."""
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann",
                           "snn_max_timesteps=256", "snn_eval_samples=20", "snn_eval_dtype=float64",
                           "hydra.run.dir=run")
    assert code == 0, stderr
    run_dir = tmp_path / "run"
    binary = json.loads((run_dir / "metrics.json").read_text())
    code, stderr = run_app("train", f"resume={run_dir}", "snn_spikes_per_step=15", "snn_max_timesteps=4")
    assert code == 0, stderr
    graded = json.loads((run_dir / "metrics.json").read_text())
    assert graded["snn_spikes_per_step"] == 15 and graded["snn_silent"] and graded["snn_timesteps"] == 1
    assert graded["snn_test_acc"] == binary["snn_test_acc"] and graded["test_acc"] == binary["test_acc"]




FINETUNE = [*SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann", "neuron.level=4", "snn_max_timesteps=4",
            "snn_finetune.epochs=2", "snn_finetune.timesteps=3"]  # 1 QANN epoch, then 2 epochs of its SNN at T = 3


def test_a_fine_tune_stopped_mid_epoch_resumes_exactly(
        run_app: RunApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """snn_finetune: the QANN's SNN trained on at T after the QANN. Stopped by SIGINT inside its second epoch, the
    checkpoint holds the finished QANN and the fine-tuning's state; the resume ends with the uninterrupted run's
    SNN weights and figures, and metrics.json reports the fine-tuned SNN after every reported step."""
    code, stderr = run_app("train", *FINETUNE, "hydra.run.dir=straight")
    assert code == 0, stderr
    with monkeypatch.context() as interrupt:
        _interrupt_at_step(4 + 6, interrupt)  # the QANN's 4 steps, then the fine-tuning's epoch 2, step 2
        code, stderr = run_app("train", *FINETUNE, "hydra.run.dir=stopped")
    assert code == 128 + signal.SIGINT and "resume=" in stderr
    saved = load_checkpoint(tmp_path / "stopped" / "checkpoints" / "last.pt", kind="train")
    assert saved["trainer"]["epoch"] == 1 and (saved["snn_trainer"]["epoch"], saved["snn_trainer"]["step_in_epoch"]) \
        == (1, 2)
    assert json.loads((tmp_path / "stopped" / "metrics.json").read_text())["pending"] == ["snn_finetune"]

    code, stderr = run_app("train", f"resume={tmp_path / 'stopped'}")
    assert code == 0, stderr
    resumed_log = (tmp_path / "stopped" / "train.log").read_text().split("resumed from")[-1]
    assert "retrain epoch" not in resumed_log and "test accuracy after" not in resumed_log  # figures came saved
    straight, resumed = (load_checkpoint(tmp_path / run / "checkpoints" / "last.pt", kind="train")
                         for run in ("straight", "stopped"))
    assert straight["snn_trainer"]["global_step"] == resumed["snn_trainer"]["global_step"] == 4 + 8
    assert any("q_threshold" in name for name in straight["snn_trainer"]["model"])
    for name, weight in straight["snn_trainer"]["model"].items():
        assert torch.equal(weight, resumed["snn_trainer"]["model"][name]), name
    metrics = [json.loads((tmp_path / run / "metrics.json").read_text())["snn_finetune"]
               for run in ("straight", "stopped")]
    assert metrics[0]["acc_at_t"] == metrics[1]["acc_at_t"]
    whole = [json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("straight", "stopped")]
    assert "pending" not in whole[1] and whole[0]["snn_acc_at_t"] == whole[1]["snn_acc_at_t"]
    assert whole[0]["energy_per_image_uj"] == whole[1]["energy_per_image_uj"]
    assert list(metrics[0]["acc_at_t"]) == ["1", "2", "3", "4", "6", "8", "16"]
    assert metrics[0]["test_acc"] == metrics[0]["acc_at_t"]["3"] and metrics[0]["energy_per_image_uj"] > 0
    assert [r["train_loss"] for r in metrics[0]["history"]] == [r["train_loss"] for r in metrics[1]["history"]]


def test_a_finished_qann_run_resumed_to_fine_tune_its_snn_and_then_for_longer(run_app: RunApp, tmp_path: Path) -> None:
    """``resume=<run> snn_finetune.epochs=N`` fine-tunes the SNN of a finished QANN run without training the QANN
    again; a second resume with more epochs goes on from the first fine-tuning's end, its cosine stretched to them."""
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann", "neuron.level=4",
                           "snn_max_timesteps=4", "hydra.run.dir=run")
    assert code == 0, stderr
    run_dir = tmp_path / "run"
    assert "snn_finetune" not in json.loads((run_dir / "metrics.json").read_text())
    for epochs in (1, 2):
        code, stderr = run_app("train", f"resume={run_dir}", f"snn_finetune.epochs={epochs}")
        assert code == 0, stderr
        finetuned = json.loads((run_dir / "metrics.json").read_text())["snn_finetune"]
        assert finetuned["epochs"] == epochs and [r["epoch"] for r in finetuned["history"]] == list(range(epochs))
        assert "retrain epoch" not in (run_dir / "train.log").read_text().split("resumed from")[-1]
    assert 0 < finetuned["history"][1]["lr"] < finetuned["history"][0]["lr"]  # still annealing, not restarted


def test_one_qann_fine_tuned_at_two_timesteps_from_copies_of_its_run(run_app: RunApp, tmp_path: Path) -> None:
    """A finished QANN run copied before its fine-tuning is fine-tuned at another T, learning rate and surrogate by
    ``resume=<copy> snn_finetune.timesteps=...``; once a fine-tuning has started, changing its T is bad input."""
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann", "neuron.level=4",
                           "snn_max_timesteps=4", "hydra.run.dir=run")
    assert code == 0, stderr
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    for run, timesteps in (("run", 2), ("copy", 3)):
        code, stderr = run_app("train", f"resume={tmp_path / run}", "snn_finetune.epochs=1",
                               f"snn_finetune.timesteps={timesteps}", "snn_finetune.lr=0.02",
                               "snn_finetune.surrogate=atan")
        assert code == 0, stderr
        finetuned = json.loads((tmp_path / run / "metrics.json").read_text())["snn_finetune"]
        assert finetuned["timesteps"] == timesteps and str(timesteps) in finetuned["acc_at_t"]
        assert finetuned["history"][0]["lr"] == pytest.approx(0.02)
    before = (tmp_path / "copy" / "metrics.json").read_text()
    code, stderr = run_app("train", f"resume={tmp_path / 'copy'}", "snn_finetune.epochs=2", "snn_finetune.timesteps=4")
    assert code != 0 and "already started with snn_finetune.timesteps=3" in stderr.strip().splitlines()[-1]
    assert (tmp_path / "copy" / "metrics.json").read_text() == before
