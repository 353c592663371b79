"""Retrain a found (or published) cell from scratch and test it.

    python train.py genotype=<outputs/search/<run>/genotype.json | DARTS_V2 | ...> [overrides]

The run directory (outputs/train/<date>_<time>/) gets checkpoints/last.pt and best.pt, tb/
(TensorBoard) and metrics.json. ``resume=<run_dir>`` continues a stopped run. Exit codes: see
aso_se/run/app.py.
"""
import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

from aso_se.run import app, checkpoint
from aso_se.train.energy_report import energy_metrics
from aso_se.train.retrain import Retrainer
from aso_se.train.snn_eval import is_qann, snn_metrics
from search_space.genotypes import Genotype, load_genotype


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with app.Run(cfg, entry_point="train") as run:
        cfg, ctx = run.cfg, run.ctx
        genotype = (Genotype.from_json(run.state["genotype"]) if run.resumed
                    else load_genotype(app.find_genotype(cfg.genotype)))
        data, neuron = instantiate(cfg.data), instantiate(cfg.neuron)
        app.check_timesteps(data, neuron)
        network = instantiate(cfg.model.network)(genotype, neuron=neuron,
                                                 num_classes=data.num_classes,
                                                 in_channels=data.in_channels,
                                                 image_size=data.image_size)
        trainer = Retrainer(
            network, optimizer=instantiate(cfg.optim.optimizer),
            scheduler=instantiate(cfg.optim.scheduler), epochs=cfg.epochs,
            auxiliary_weight=cfg.model.auxiliary_weight, drop_path_prob=cfg.model.drop_path_prob,
            grad_clip=cfg.grad_clip, precision=cfg.trainer.precision, ctx=ctx,
            log_every_n_steps=cfg.trainer.log_every_n_steps, cuda_graph=cfg.cuda_graph,
            channels_last=cfg.channels_last, label_smoothing=cfg.label_smoothing)
        if run.resumed:
            with checkpoint.restore_errors(run.checkpoint_path):
                trainer.load_state_dict(run.state["trainer"])
        board = run.tensorboard(cfg.logger, step=trainer.global_step)
        if board is not None:
            board.genotype(genotype, trainer.global_step)
        train_loader, test_loader = data.train_loaders(cfg.batch_size, seed=cfg.seed, rank=ctx.rank,
                                                       world_size=ctx.world_size, device=ctx.device)

        def save(is_best: bool) -> None:
            run.save({"genotype": genotype.to_json(), "trainer": trainer.state_dict()})
            if is_best:
                run.save({"genotype": genotype.to_json(), "model": network.state_dict(),
                          "epoch": trainer.epoch, "test_acc": trainer.best_test_acc},
                         run.run_dir / "checkpoints" / "best.pt")

        if not trainer.fit(train_loader, test_loader, board=board, should_stop=run.should_stop,
                           on_epoch_end=save, checkpoint_due=run.checkpoint_due,
                           save_checkpoint=lambda: save(is_best=False)):
            save(is_best=False)
            run.raise_if_stopped()
        if ctx.is_main:
            metrics = trainer.metrics()
            _, full_test = data.train_loaders(cfg.batch_size, seed=cfg.seed)  # the full test set on rank 0
            if is_qann(network):  # minutes on a CPU: a stop signal ends it (the last epoch is saved; resume redoes it)
                snn_test = full_test
                if cfg.snn_eval_samples is not None:  # the SNN runs up to T_eq steps per image: allow a cap
                    data.max_test_samples = min(cfg.snn_eval_samples, data.max_test_samples or cfg.snn_eval_samples)
                    _, snn_test = data.train_loaders(cfg.batch_size, seed=cfg.seed)
                metrics.update(snn_metrics(network, snn_test, device=ctx.device,
                                           max_timesteps=cfg.snn_max_timesteps, dtype=cfg.snn_eval_dtype,
                                           board=board, step=trainer.global_step, before_batch=run.raise_if_stopped))
                run.raise_if_stopped()
            metrics.update(energy_metrics(network, full_test, device=ctx.device, board=board,
                                          step=trainer.global_step, snn_timesteps=metrics.get("snn_timesteps")))
            checkpoint.save_json({**metrics, "wall_time_s": run.wall_time_s,
                                  "genotype": genotype.to_json(), "world_size": ctx.world_size,
                                  "device": str(ctx.device), "precision": cfg.trainer.precision,
                                  "cuda_graph": cfg.cuda_graph},
                                 run.run_dir / "metrics.json")


if __name__ == "__main__":
    app.main_guard(main)
