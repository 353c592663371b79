"""train.py's start of a new retrain: ``init_from`` (another run's weights) and ``threshold_init`` (the QANN's
thresholds from its first training batch); a resumed run has its own weights and skips both."""
from __future__ import annotations

import logging
from pathlib import Path

from aso_se.parallel.distributed import broadcast_module
from aso_se.run.checkpoint import load_checkpoint
from aso_se.run.lifecycle import Run
from aso_se.train.retrain import Retrainer
from aso_se.train.warm_start import THRESHOLD_INITS, calibrate_thresholds, copy_weights
from search_space.errors import UserInputError

log = logging.getLogger(__name__)


def check_warm_start(run: Run) -> None:
    """Bad ``init_from`` / ``threshold_init`` settings, before any data or network is built."""
    cfg = run.cfg
    if cfg.get("threshold_init", "config") not in THRESHOLD_INITS:
        raise UserInputError(f"threshold_init={cfg.threshold_init!r}: use one of {', '.join(THRESHOLD_INITS)}")
    if cfg.get("init_from") and not run.resumed:
        source_checkpoint(cfg.init_from)


def source_checkpoint(init_from: str) -> Path:
    """The checkpoint ``init_from`` names: a file, or a train run dir's checkpoints/last.pt."""
    path = Path(init_from)
    if path.is_dir():
        path = path / "checkpoints" / "last.pt"
    if not path.is_file():
        raise UserInputError(f"init_from={init_from}: no such checkpoint; give a train run dir (with "
                             "checkpoints/last.pt) or a checkpoint file, or drop init_from")
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
