"""Search a spiking cell with ASO-SE.

    python search.py [overrides]      e.g. experiment=cifar10_snn, trainer=ddp, resume=<run_dir>

The run directory (outputs/search/<date>_<time>/) gets genotype.json, search_metrics.json (its minutes and
final α entropy), genotypes/cycle_<k>.json, strength.json (derive=strength; checkpoints/strength_paths.pt keeps a
stopped judging's paths for its resume), checkpoints/last.pt, tb/
(TensorBoard), search.log and Hydra's config; ``python train.py`` then retrains the newest genotype.json. Exit
codes: see aso_se/run/errors.py.
"""
from aso_se.run import stop_signals

stop_signals.catch_early()  # before the slow imports: a SIGTERM during them is a stop, not a silent death

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

from aso_se.run.guard import main_guard
from aso_se.run.inputs import check_timesteps
from aso_se.run.lifecycle import Run
from aso_se.run.search_callbacks import SearchCallbacks
from aso_se.search.strength import check_rule


@hydra.main(config_path="conf", config_name="search", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with Run(cfg, entry_point="search") as run:
        cfg, ctx = run.cfg, run.ctx
        data, neuron, space = instantiate(cfg.data), instantiate(cfg.neuron), instantiate(cfg.search_space)
        check_timesteps(data, neuron)
        derive = cfg.get("derive", "alpha")  # a run saved before derive= existed derives from α
        check_rule(derive, cfg.get("derive_images"), space.primitives)
        engine = instantiate(cfg.search, _convert_="object")(
            search_space=space, neuron=neuron, num_classes=data.num_classes,
            in_channels=data.in_channels, optim=instantiate(cfg.optim, _convert_="object"),
            device=ctx.device, precision=cfg.trainer.precision, seed=cfg.seed)
        run.restore(engine, "engine")
        weights_loader, arch_loader = data.search_loaders(cfg.batch_size, seed=cfg.seed, rank=ctx.rank,
                                                          world_size=ctx.world_size, device=ctx.device)
        board = run.tensorboard(cfg.logger, step=engine.progress["global_step"])
        callbacks = SearchCallbacks(run, board, engine=engine, steps_per_epoch=len(weights_loader),
                                    log_every_n_steps=cfg.trainer.log_every_n_steps)
        engine.run(weights_loader, arch_loader, callbacks=callbacks, should_stop=run.should_stop)
        callbacks.save_checkpoint()  # the search's end, or where a stop left it
        run.raise_if_stopped()
        genotype = engine.genotypes[-1]
        if derive == "strength":  # the weights judge each edge's ops instead of α
            genotype = callbacks.derive_by_strength(genotype, arch_loader)
        callbacks.finish(genotype)


if __name__ == "__main__":
    main_guard(main)
