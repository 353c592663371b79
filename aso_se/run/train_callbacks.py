"""What train.py does at the Retrainer's callbacks: TensorBoard, checkpoints, metrics.json.

The Retrainer (``aso_se.train.retrain.Retrainer``) calls ``on_log`` with the running train
scalars every ``trainer.log_every_n_steps`` steps, ``on_epoch_end`` once an epoch is tested, and
``save_checkpoint`` mid-epoch when ``checkpoint_due``; ``save_checkpoint`` is also the entry point's save at a stop.
Here they become TensorBoard scalars and histograms, ``checkpoints/last.pt`` where the run's checkpoint policy says
(``aso_se.run.checkpoint_policy``: every ``trainer.checkpoint_every_n_epochs``-th epoch's end and the last), and
``checkpoints/best.pt`` when the test accuracy is the best so far. ``finish`` writes metrics.json as each stage
ends: once training ends, with its figures and ``pending`` (the evaluations still to come), so a machine lost during
them keeps the training's result; for a QANN again after the exact SNN's evaluation (all ranks share it), pending
the energy; then with the energy per image, without ``pending``. Only rank 0 writes.
"""
from __future__ import annotations

import logging
import signal
from typing import Any

from aso_se.loop import LoopCallbacks
from aso_se.monitor.tensorboard import TensorBoardLogger
from aso_se.run.atomic_write import save_json
from aso_se.run.errors import Interrupted, non_finite_weights
from aso_se.run.lifecycle import Run
from aso_se.run.tensor_checks import first_non_finite, tensor_digest
from aso_se.train.energy_report import energy_metrics
from aso_se.train.retrain import Retrainer
from aso_se.train.snn_eval import check_snn_settings, is_qann, snn_metrics
from search_space.genotypes import Genotype

log = logging.getLogger(__name__)


class TrainCallbacks(LoopCallbacks):
    """The Retrainer's callbacks for one retrain run of ``genotype`` (see the module docstring).

    The genotype goes to TensorBoard at construction, at the step the run starts from.
    """

    def __init__(self, run: Run, board: TensorBoardLogger | None, *, trainer: Retrainer,
                 genotype: Genotype) -> None:
        self.run = run
        self.board = board
        self.trainer = trainer
        self.genotype = genotype
        check_snn_settings(run.cfg.snn_eval_dtype, run.cfg.snn_spikes_per_step, run.cfg.snn_first_timesteps)
        if board is not None:
            board.genotype(genotype, trainer.global_step)
        if run.resumed and run.ctx.is_main:
            log.info("resumed at global step %d, weights %s", trainer.global_step,
                     tensor_digest(trainer.network.state_dict()))

    def on_log(self, scalars: dict[str, float], step: int) -> None:
        if self.board is not None:
            self.board.scalars("train", scalars, step)

    def on_epoch_end(self, summary: dict[str, Any]) -> None:
        trainer, is_best = self.trainer, summary["is_best"]
        if self.board is not None:
            test, step = trainer.last_test, trainer.global_step
            self.board.scalars("test", {"loss": test["loss"], "acc": test["acc"]}, step)
            self.board.firing_rates(test["firing_rates"], step)
            self.board.sparse_conv_paths(trainer.epoch_conv_paths, step)
            self.board.flush()
        if self.run.checkpoints.epoch_due(trainer.epoch, last=trainer.epoch == trainer.epochs):
            self.save(is_best, background=True)
        elif is_best:
            self.save_best(background=True)

    def checkpoint_due(self) -> bool:
        return self.run.checkpoints.timed_due()

    def save_checkpoint(self) -> None:
        self.save()  # the state a stop after this step saves: resumes at the next step

    def save(self, is_best: bool = False, *, background: bool = False) -> None:
        """``checkpoints/last.pt``: the Retrainer's whole state; with ``is_best`` also ``best.pt``:
        the weights alone, with the epoch and its test accuracy (rank 0). Never NaN/Inf weights (every
        rank checks, so all stop together). ``background``: written while training goes on (`Run.save`)."""
        trainer = self.trainer
        bad = first_non_finite({"model": trainer.network.state_dict(),
                                "optimizer": trainer.optimizer.state_dict()["state"]})
        if bad is not None:
            raise non_finite_weights(bad, trainer.global_step, lower="optim.optimizer.lr")
        self.run.save({"genotype": self.genotype.to_json(), "trainer": self.trainer.state_dict()},
                      background=background)
        if is_best:
            self.save_best(background=background)

    def save_best(self, *, background: bool = False) -> None:
        """``checkpoints/best.pt``: the weights alone, with the epoch and its test accuracy (rank 0)."""
        self.run.save({"genotype": self.genotype.to_json(), "model": self.trainer.network.state_dict(),
                       "epoch": self.trainer.epoch, "test_acc": self.trainer.best_test_acc},
                      self.run.run_dir / "checkpoints" / "best.pt", background=background)

    def finish(self, data: Any, later: tuple[str, ...] = ()) -> dict[str, Any]:
        """``metrics.json`` (rank 0): the Retrainer's metrics, a QANN's exact SNN, the energy per image; returns them.
        ``later``: the stages still to come after these (``pending`` until they end).

        Both evaluations read the full test set of ``data`` (a ClassificationData), not a rank's shard.
        Every rank runs its share of the SNN's batches (evaluate_snn sharded); rank 0 alone then
        measures the energy and writes, while the others leave.
        """
        run, trainer, cfg, ctx = self.run, self.trainer, self.run.cfg, self.run.ctx
        network, step = trainer.network, trainer.global_step
        metrics = trainer.metrics()
        marks = metrics["wall_time_marks_s"] = {"trained": run.wall_time_s}  # what each stage costs
        if ctx.is_main:  # the training's figures first: the evaluations below take minutes
            self.save_metrics(metrics, pending=["snn", "energy", *later] if is_qann(network) else ["energy", *later])
        _, full_test = data.train_loaders(cfg.batch_size, seed=cfg.seed)
        snn_test = full_test
        try:
            if is_qann(network):  # minutes on a CPU: a stop signal ends it (the last epoch is saved; resume redoes it)
                if cfg.snn_eval_samples is not None:  # the SNN runs up to T_eq steps per image: allow a cap
                    data.max_test_samples = min(cfg.snn_eval_samples, data.max_test_samples or cfg.snn_eval_samples)
                    _, snn_test = data.train_loaders(cfg.batch_size, seed=cfg.seed)
                metrics.update(snn_metrics(network, snn_test, device=ctx.device, max_timesteps=cfg.snn_max_timesteps,
                                           dtype=cfg.snn_eval_dtype, board=self.board, step=step,
                                           before_batch=self.stop_all_ranks_together, sharded=ctx.distributed,
                                           spikes_per_step=cfg.snn_spikes_per_step,
                                           first_timesteps=cfg.snn_first_timesteps))
                run.raise_if_stopped()
                marks["snn_evaluated"] = run.wall_time_s
                if ctx.is_main:  # the SNN's figures kept should the host go before the energy report ends
                    self.save_metrics(metrics, pending=["energy", *later])
            if not ctx.is_main:
                return metrics
            metrics.update(energy_metrics(network, full_test, device=ctx.device, board=self.board, step=step,
                                          snn_timesteps=metrics.get("snn_timesteps"),
                                          spikes_per_step=cfg.snn_spikes_per_step))
        finally:  # the energy count reads part of a pass: its workers stopped here, not by the garbage collector
            full_test.close()
            snn_test.close()
        marks["energy_measured"] = run.wall_time_s
        self.save_metrics(metrics, pending=list(later))
        return metrics

    def save_metrics(self, metrics: dict[str, Any], pending: list[str] | None = None) -> None:
        run, cfg, ctx = self.run, self.run.cfg, self.run.ctx
        save_json({**metrics, "wall_time_s": run.wall_time_s, "cpu_time_s": run.cpu_time_s,
                   "genotype": self.genotype.to_json(), "world_size": ctx.world_size,
                   "global_batch_size": cfg.batch_size * ctx.world_size, "device": str(ctx.device),
                   "precision": cfg.trainer.precision, "cuda_graph": cfg.cuda_graph,
                   **({"pending": pending} if pending else {})},
                  run.run_dir / "metrics.json")

    def stop_all_ranks_together(self) -> None:
        """Before each SNN batch: ``run.should_stop`` is collective, so every rank leaves at the same batch
        and none waits in the evaluation's reductions for one that stopped (exit 128 + signal)."""
        run = self.run
        if run.should_stop():
            run.raise_if_stopped()
            raise Interrupted(signal.SIGTERM, run.run_dir, run.entry_point)  # the signal reached another rank only
