"""train.py's spike-domain fine-tuning stage: after a QANN's retrain, its SNN trained on with BPTT at T.

The stage runs once the QANN's metrics are written (``snn_finetune.epochs`` > 0). Its checkpoints hold the QANN's
finished state and figures and the fine-tuning's state (``snn_trainer``), so a stop during it resumes there;
TensorBoard gets its curves under ``snn_finetune/``; metrics.json gets ``snn_finetune`` (accuracy after 1, 2, 4,
6, 8, 16 and T steps, energy per image at T, the epochs' history) once it ends.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from aso_se.loop import LoopCallbacks
from aso_se.monitor.tensorboard import TensorBoardLogger
from aso_se.run.errors import non_finite_weights, out_of_memory_in_finetuning
from aso_se.run.lifecycle import Run
from aso_se.run.tensor_checks import first_non_finite
from aso_se.run.train_callbacks import TrainCallbacks
from aso_se.train.retrain import Retrainer
from aso_se.train.snn_eval import is_qann
from aso_se.train.snn_finetune import (
    FinetuneSettings,
    finetune_trainer,
    finetuned_energy,
    finetuned_metrics,
    follow_new_epochs,
)
from search_space.errors import UserInputError

log = logging.getLogger(__name__)


def finetune_settings(run: Run, network: nn.Module) -> FinetuneSettings:
    """The run's checked ``snn_finetune`` settings, before any training: fine-tuning needs a QANN."""
    settings = FinetuneSettings.from_config(run.cfg.get("snn_finetune"))
    if settings.epochs and not is_qann(network):
        raise UserInputError(f"snn_finetune.epochs={settings.epochs} fine-tunes the SNN of a QANN; train with "
                             "neuron=st_bif_qann or set snn_finetune.epochs=0")
    return settings


class FinetuneCallbacks(LoopCallbacks):
    """The fine-tuning Retrainer's callbacks (``aso_se.loop``): TensorBoard under ``snn_finetune/`` and
    ``checkpoints/last.pt`` where the run's checkpoint policy says (``Run.checkpoints``)."""

    def __init__(self, run: Run, board: TensorBoardLogger | None, *, trainer: Retrainer, qann: TrainCallbacks,
                 qann_metrics: dict[str, Any]) -> None:
        self.run, self.board, self.trainer, self.qann = run, board, trainer, qann
        self.qann_metrics = qann_metrics

    def on_log(self, scalars: dict[str, float], step: int) -> None:
        if self.board is not None:
            self.board.scalars("snn_finetune/train", scalars, step)

    def on_epoch_end(self, summary: dict[str, Any]) -> None:
        trainer = self.trainer
        if self.board is not None:
            test = trainer.last_test
            self.board.scalars("snn_finetune/test", {"loss": test["loss"], "acc": test["acc"]}, trainer.global_step)
            self.board.flush()
        if self.run.checkpoints.epoch_due(trainer.epoch, last=trainer.epoch == trainer.epochs):
            self.save(background=True)

    def checkpoint_due(self) -> bool:
        return self.run.checkpoints.timed_due()

    def save_checkpoint(self) -> None:
        self.save()  # the state a stop after this step saves: resumes at the next step

    def save(self, *, background: bool = False) -> None:
        """``checkpoints/last.pt``: the finished QANN's state and figures and the fine-tuning's state (never NaN/Inf
        weights)."""
        trainer = self.trainer
        bad = first_non_finite({"model": trainer.network.state_dict(),
                                "optimizer": trainer.optimizer.state_dict()["state"]})
        if bad is not None:
            raise non_finite_weights(bad, trainer.global_step, lower="snn_finetune.lr")
        self.run.save({"genotype": self.qann.genotype.to_json(), "trainer": self.qann.trainer.state_dict(),
                       "qann_metrics": self.qann_metrics, "snn_trainer": trainer.state_dict()}, background=background)


def qann_metrics(run: Run, callbacks: TrainCallbacks, data: Any, settings: FinetuneSettings) -> dict[str, Any]:
    """The QANN's metrics (``TrainCallbacks.finish``, pending the fine-tuning if it comes). A run stopped during its
    fine-tuning saved them: its resume takes them from the checkpoint instead of evaluating the QANN's SNN again."""
    if settings.epochs and run.resumed and "qann_metrics" in run.state:
        return run.state["qann_metrics"]
    return callbacks.finish(data, later=("snn_finetune",) if settings.epochs else ())


def run_finetune(run: Run, board: TensorBoardLogger | None, settings: FinetuneSettings, qann: TrainCallbacks,
                 metrics: dict[str, Any], data: Any, train_loader: Any, test_loader: Any) -> None:
    """Fine-tunes the QANN of ``qann.trainer`` at ``settings.timesteps``, then adds ``snn_finetune`` to
    ``metrics`` (the QANN's, from ``TrainCallbacks.finish``) and writes metrics.json (rank 0)."""
    cfg, ctx = run.cfg, run.ctx
    trainer = finetune_trainer(
        qann.trainer.network, settings, optimizer=instantiate(cfg.optim.optimizer), grad_clip=cfg.grad_clip,
        precision=cfg.trainer.precision, ctx=ctx, log_every_n_steps=cfg.trainer.log_every_n_steps,
        cuda_graph=cfg.cuda_graph, channels_last=cfg.channels_last, label_smoothing=cfg.label_smoothing)
    trainer.global_step = qann.trainer.global_step  # its curves go on where the QANN's end
    if run.resumed and "snn_trainer" in run.state:
        run.restore(trainer, "snn_trainer")
        follow_new_epochs(trainer)  # a resume may fine-tune for longer
    log.info("spike-domain fine-tuning: %d epochs of the binary SNN at T = %d", settings.epochs, settings.timesteps)
    callbacks = FinetuneCallbacks(run, board, trainer=trainer, qann=qann, qann_metrics=metrics)
    if settings.batch_size is not None and settings.batch_size != cfg.batch_size:  # BPTT holds T steps' activations
        train_loader, test_loader = data.train_loaders(settings.batch_size, seed=cfg.seed, rank=ctx.rank,
                                                       world_size=ctx.world_size, device=ctx.device)
    try:
        finished = trainer.fit(train_loader, test_loader, callbacks=callbacks, should_stop=run.should_stop)
    except torch.OutOfMemoryError as error:
        raise out_of_memory_in_finetuning(run.run_dir, settings.batch_size or cfg.batch_size,
                                          settings.timesteps) from error
    if not finished:
        callbacks.save_checkpoint()
        run.raise_if_stopped()
    marks = {"finetuned": run.wall_time_s}
    _, full_test = data.train_loaders(cfg.batch_size, seed=cfg.seed)
    try:
        finetuned = finetuned_metrics(trainer, settings, full_test, with_energy=False, sharded=ctx.distributed,
                                      board=board, before_batch=qann.stop_all_ranks_together)
        run.raise_if_stopped()
        marks["finetune_evaluated"] = run.wall_time_s
        if ctx.is_main:
            finetuned.update(finetuned_energy(trainer, full_test, board))
            marks["finetune_energy_measured"] = run.wall_time_s
    finally:  # its workers stopped here, not by the garbage collector (see EpochLoader.close)
        full_test.close()
    metrics = {**metrics, "wall_time_marks_s": {**metrics.get("wall_time_marks_s", {}), **marks}}
    log.info("fine-tuned SNN: %.4f test accuracy at T = %d (%s)", finetuned["test_acc"], settings.timesteps,
             ", ".join(f"T={t}: {acc:.4f}" for t, acc in finetuned["acc_at_t"].items()))
    if ctx.is_main:
        qann.save_metrics({**metrics, "snn_finetune": finetuned})
