"""What a retrain learns from besides its labels: ``init_from`` (another run's weights), ``threshold_init`` (the
QANN's thresholds from its first training batch), both skipped by a resumed run, and ``distill.teacher`` (a trained
run whose soft answers the loss blends in, rebuilt on resume)."""
from __future__ import annotations

import logging
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import OmegaConf

from aso_se.parallel.distributed import broadcast_module
from aso_se.run.checkpoint import load_checkpoint
from aso_se.run.lifecycle import Run
from aso_se.train.distill import Distillation
from aso_se.train.retrain import Retrainer
from aso_se.train.warm_start import THRESHOLD_INITS, calibrate_thresholds, copy_weights
from search_space.errors import UserInputError
from search_space.genotypes import Genotype

log = logging.getLogger(__name__)


def check_warm_start(run: Run) -> None:
    """Bad ``init_from`` / ``threshold_init`` settings, before any data or network is built."""
    cfg = run.cfg
    if cfg.get("threshold_init", "config") not in THRESHOLD_INITS:
        raise UserInputError(f"threshold_init={cfg.threshold_init!r}: use one of {', '.join(THRESHOLD_INITS)}")
    if cfg.get("init_from") and not run.resumed:
        source_checkpoint(cfg.init_from)
    teacher = (cfg.get("distill") or {}).get("teacher")
    if teacher:
        source_checkpoint(teacher, key="distill.teacher")


def source_checkpoint(source: str, *, key: str = "init_from") -> Path:
    """The checkpoint ``source`` names: a file, or a train run dir's checkpoints/last.pt."""
    path = Path(source)
    if path.is_dir():
        path = path / "checkpoints" / "last.pt"
    if not path.is_file():
        raise UserInputError(f"{key}={source}: no such checkpoint; give a train run dir (with "
                             f"checkpoints/last.pt) or a checkpoint file, or drop {key}")
    return path


def warm_start(run: Run, trainer: Retrainer, train_loader) -> None:
    """Before a new run's first step: the weights of ``init_from``, then ``threshold_init=lsq``'s thresholds from
    the first training batch (rank 0's, on every rank)."""
    cfg, ctx = run.cfg, run.ctx
    if run.resumed:
        return
    network = trainer.network
    if cfg.get("init_from"):
        path = source_checkpoint(cfg.init_from)
        source = load_checkpoint(path, kind="train")["trainer"]["model"]
        left = copy_weights(network, source, source_name=str(cfg.init_from))
        log.info("init_from %s: %d tensors copied, %d left as initialized", path,
                 len(network.state_dict()) - len(left), len(left))
    if cfg.get("threshold_init", "config") == "lsq":
        train_loader.set_epoch(0)
        images, _ = next(iter(train_loader))
        count = calibrate_thresholds(network, trainer._to_device(images))
        log.info("threshold_init=lsq: %d quantizer thresholds set from the first training batch", count)
    if ctx.distributed:
        broadcast_module(network)  # one start on every rank: rank 0's batch set the thresholds


def distillation(run: Run, data) -> Distillation | None:
    """``distill.teacher=<train run dir | checkpoint>``: that run's network, rebuilt from its saved config and
    genotype with its last weights, as the frozen teacher; None without a teacher."""
    settings = run.cfg.get("distill") or {}
    if not settings.get("teacher"):
        return None
    path = source_checkpoint(settings["teacher"], key="distill.teacher")
    state = load_checkpoint(path, kind="train")
    saved = OmegaConf.create(state["config"])
    teacher = instantiate(saved.model.network)(Genotype.from_json(state["genotype"]), neuron=instantiate(saved.neuron),
                                               num_classes=data.num_classes, in_channels=data.in_channels,
                                               image_size=data.image_size)
    try:
        teacher.load_state_dict(state["trainer"]["model"])
    except RuntimeError as error:
        raise UserInputError(f"distill.teacher={settings['teacher']}: its weights do not fit its network on this "
                             f"data set ({str(error).splitlines()[0]}); give a run trained on this data") from None
    log.info("distill: teacher %s (%s neurons), weight %s, temperature %s", path, saved.neuron.kind,
             settings.get("weight", 0.5), settings.get("temperature", 4.0))
    return Distillation(teacher, weight=settings.get("weight", 0.5), temperature=settings.get("temperature", 4.0))
