"""The ``trainer`` settings a run checks before it starts: each wrong one is one line of bad input."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from search_space.errors import UserInputError


@dataclass(frozen=True)
class TrainerSettings:
    """What the run itself does with ``trainer``: when it saves, how many saves it keeps, how long it waits."""

    checkpoint_every_s: float | None  # None: checkpoints at epoch ends only
    checkpoint_every_n_epochs: int
    keep_checkpoints: int
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
    checkpoint_every_s = _checkpoint_interval_s(trainer.get("checkpoint_every_min"))
    every = trainer.get("checkpoint_every_n_epochs", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise UserInputError(f"trainer.checkpoint_every_n_epochs={every!r} must be an integer >= 1; fix "
                             f"trainer.checkpoint_every_n_epochs")
    keep = trainer.get("keep_checkpoints", 1)
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise UserInputError(f"trainer.keep_checkpoints={keep!r} must be an integer >= 1 (last.pt and the "
                             f"ones saved before it); fix trainer.keep_checkpoints")
    peer_timeout_s = trainer.get("peer_timeout_s", 300)
    if isinstance(peer_timeout_s, bool) or not isinstance(peer_timeout_s, (int, float)) or peer_timeout_s <= 0:
        raise UserInputError(f"trainer.peer_timeout_s={peer_timeout_s!r} must be a positive number of seconds; "
                             f"fix trainer.peer_timeout_s")
    return TrainerSettings(checkpoint_every_s, every, keep, float(peer_timeout_s))


def _checkpoint_interval_s(minutes: Any) -> float | None:
    """``trainer.checkpoint_every_min`` in seconds (None: checkpoints at epoch ends only)."""
    if minutes is None:
        return None
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or minutes <= 0:
        raise UserInputError(f"trainer.checkpoint_every_min={minutes} must be a positive number of "
                             f"minutes; or null to save at epoch ends only")
    return float(minutes) * 60.0
