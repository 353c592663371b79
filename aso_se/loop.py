"""The contract between a training loop and the code that runs it, shared by the search and the retrain.

Both loops are called alike: ``ASOSEEngine.run(weights_loader, arch_loader, *, callbacks, should_stop)`` and
``Retrainer.fit(train_loader, test_loader, *, callbacks, should_stop)``. Each returns True once it has run to its
end and False when ``should_stop()``, polled after every step, ended it early: the caller then saves and exits.
A loop reports to one :class:`LoopCallbacks` object and asks it whether a timed checkpoint is due.
"""
from __future__ import annotations

from typing import Any, Protocol


class ResumableLoader(Protocol):
    """What a loop needs from a loader (``aso_se.data``'s loaders have it): the data order is a pure function of
    (seed, epoch), and a stopped epoch goes on at its next batch."""

    def __iter__(self) -> Any: ...

    def __len__(self) -> int: ...

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None: ...


class LoopCallbacks:
    """What a loop tells the code that runs it, and asks of it. Each method does nothing by default: override the
    ones you need."""

    def on_log(self, scalars: dict[str, Any], step: int) -> None:
        """The latest training scalars, at the loop's global ``step`` (each loop's docstring says how often)."""

    def on_epoch_end(self, summary: dict[str, Any]) -> None:
        """Once an epoch's state is final, with the epoch's figures: the place to save an epoch's checkpoint."""

    def checkpoint_due(self) -> bool:
        """Asked after every step but an epoch's last (the epoch's end saves): whether to save mid-epoch now."""
        return False

    def save_checkpoint(self) -> None:
        """Saves the loop's state as it is after the step just taken: what a stop there would save."""


def never() -> bool:
    """The default ``should_stop``: the loop runs to its end."""
    return False
