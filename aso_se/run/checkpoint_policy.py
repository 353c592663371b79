"""When the search, the retrain and the spike-domain fine-tuning save ``checkpoints/last.pt``, and how many are kept.

One policy per run (``Run.checkpoints``) serves every loop, from the ``trainer`` config (checked here; built by
``aso_se.run.trainer_settings``): ``checkpoint_every_n_epochs`` (a save at the end of every n-th epoch, and of a
retrain's or fine-tuning's last), ``checkpoint_every_min`` (a save mid-epoch once that long has passed since the
last save; null: epoch ends only) and ``keep_checkpoints`` (last.pt and the ones saved before it). A stop saves
whatever the policy says.
"""
from __future__ import annotations

import time
from typing import Any

from search_space.errors import UserInputError


class CheckpointPolicy:
    """The trainer config's checkpoint settings, checked (see the module docstring).

    ``timed``: whether this process takes timed checkpoints at all (rank 0 alone writes checkpoints).
    """

    def __init__(self, *, every_n_epochs: Any = 1, every_min: Any = None, keep: Any = 1) -> None:
        if every_min is not None and (isinstance(every_min, bool) or not isinstance(every_min, (int, float))
                                      or every_min <= 0):
            raise UserInputError(f"trainer.checkpoint_every_min={every_min} must be a positive number of "
                                 f"minutes; or null to save at epoch ends only")
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1:
            raise UserInputError(f"trainer.checkpoint_every_n_epochs={every_n_epochs!r} must be an integer >= 1; fix "
                                 f"trainer.checkpoint_every_n_epochs")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise UserInputError(f"trainer.keep_checkpoints={keep!r} must be an integer >= 1 (last.pt and the "
                                 f"ones saved before it); fix trainer.keep_checkpoints")
        self.every_n_epochs, self.keep = every_n_epochs, keep
        self.timed = True
        self.every_s = None if every_min is None else float(every_min) * 60.0
        self._saved_at = time.monotonic()

    @classmethod
    def from_config(cls, trainer: Any) -> CheckpointPolicy:
        """The policy of a ``trainer`` config node (its absent keys: their defaults)."""
        return cls(every_n_epochs=trainer.get("checkpoint_every_n_epochs", 1),
                   every_min=trainer.get("checkpoint_every_min"), keep=trainer.get("keep_checkpoints", 1))

    def epoch_due(self, epochs_done: int, *, last: bool = False) -> bool:
        """Whether the end of epoch ``epochs_done`` (counted from 1) saves: every n-th epoch's, and the ``last``."""
        return last or epochs_done % self.every_n_epochs == 0

    def timed_due(self) -> bool:
        """Whether ``checkpoint_every_min`` has passed since the last save: a loop then saves mid-epoch, the state
        a stop there would save."""
        return self.timed and self.every_s is not None and time.monotonic() - self._saved_at >= self.every_s

    def saved(self) -> None:
        """``last.pt`` was just saved: the timer starts anew."""
        self._saved_at = time.monotonic()
