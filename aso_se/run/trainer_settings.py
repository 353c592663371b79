"""The ``trainer`` settings a run checks before it starts: each wrong one is one line of bad input.

The checkpoint settings (``checkpoint_every_n_epochs``, ``checkpoint_every_min``, ``keep_checkpoints``) are checked
by the run's one `CheckpointPolicy` (aso_se.run.checkpoint_policy), built here.
"""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from aso_se.run.checkpoint_policy import CheckpointPolicy
from search_space.errors import UserInputError


@dataclass(frozen=True)
class TrainerSettings:
    """What the run itself does with ``trainer``: when it saves and how many saves it keeps (``checkpoints``), how
    long it waits for a peer."""

    checkpoints: CheckpointPolicy
    peer_timeout_s: float


def check_settings(cfg: DictConfig, entry_point: str) -> TrainerSettings:
    """The run's ``trainer`` settings, checked (and that search.py was not given train.py's ``model=``)."""
    if entry_point == "search" and cfg.get("model") is not None:  # conf/search.yaml pins it
        raise UserInputError("model= chooses train.py's network; search.py's supernet is sized by "
                             "search.supernet.channels and search.supernet.layers")
    trainer = cfg.trainer
    allowed = ("fp32", "bf16", "fp16") if entry_point == "train" else ("fp32", "bf16")
    if trainer.precision not in allowed:
        raise UserInputError(f"trainer.precision={trainer.precision} is not supported by {entry_point}.py; "
                             f"use {' or '.join(allowed)}")
    checkpoints = CheckpointPolicy.from_config(trainer)
    peer_timeout_s = trainer.get("peer_timeout_s", 300)
    if isinstance(peer_timeout_s, bool) or not isinstance(peer_timeout_s, (int, float)) or peer_timeout_s <= 0:
        raise UserInputError(f"trainer.peer_timeout_s={peer_timeout_s!r} must be a positive number of seconds; "
                             f"fix trainer.peer_timeout_s")
    return TrainerSettings(checkpoints, float(peer_timeout_s))
