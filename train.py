"""Retrain a found (or published) cell from scratch and test it.

    python train.py genotype=<outputs/search/<run>/genotype.json | DARTS_V2 | ...> [overrides]

The run directory (outputs/train/<date>_<time>/) gets checkpoints/last.pt and best.pt, tb/
(TensorBoard) and metrics.json (written once training ends, with ``pending`` naming the SNN and energy evaluations
still to come, and again as each is done). ``resume=<run_dir>`` continues a stopped run. Exit codes: see
aso_se/run/errors.py.
"""
from aso_se.run import stop_signals

stop_signals.catch_early()  # before the slow imports: a SIGTERM during them is a stop, not a silent death

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

from aso_se.run.finetune_stage import finetune_settings, qann_metrics, run_finetune
from aso_se.run.guard import main_guard
from aso_se.run.inputs import check_timesteps, genotype_to_train
from aso_se.run.lifecycle import Run
from aso_se.run.train_callbacks import TrainCallbacks
from aso_se.run.warm_start import check_warm_start, distillation, warm_start
from aso_se.train.retrain import Retrainer


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with Run(cfg, entry_point="train") as run:
        cfg, ctx = run.cfg, run.ctx
        genotype = genotype_to_train(run)
        data, neuron = instantiate(cfg.data), instantiate(cfg.neuron)
        check_timesteps(data, neuron)
        network = instantiate(cfg.model.network)(genotype, neuron=neuron, num_classes=data.num_classes,
                                                 in_channels=data.in_channels, image_size=data.image_size)
        finetune = finetune_settings(run, network)
        check_warm_start(run)
        trainer = Retrainer(
            network, optimizer=instantiate(cfg.optim.optimizer), scheduler=instantiate(cfg.optim.scheduler),
            epochs=cfg.epochs, auxiliary_weight=cfg.model.auxiliary_weight, drop_path_prob=cfg.model.drop_path_prob,
            grad_clip=cfg.grad_clip, precision=cfg.trainer.precision, ctx=ctx,
            log_every_n_steps=cfg.trainer.log_every_n_steps, cuda_graph=cfg.cuda_graph,
            channels_last=cfg.channels_last, label_smoothing=cfg.label_smoothing, distill=distillation(run, data))
        run.restore(trainer, "trainer")
        board = run.tensorboard(cfg.logger, step=trainer.global_step)
        callbacks = TrainCallbacks(run, board, trainer=trainer, genotype=genotype)
        train_loader, test_loader = data.train_loaders(cfg.batch_size, seed=cfg.seed, rank=ctx.rank,
                                                       world_size=ctx.world_size, device=ctx.device)
        warm_start(run, trainer, train_loader)
        if not trainer.fit(train_loader, test_loader, callbacks=callbacks, should_stop=run.should_stop):
            callbacks.save_checkpoint()
            run.raise_if_stopped()
        metrics = qann_metrics(run, callbacks, data, finetune)
        if finetune.epochs:  # spike-domain fine-tuning of the QANN's binary SNN at T
            run_finetune(run, board, finetune, callbacks, metrics, data, train_loader, test_loader)


if __name__ == "__main__":
    main_guard(main)
