"""Progress of a training loop: a tqdm bar per epoch on a terminal, one log line per epoch.

Both entry points use it (the search through its callbacks, the retrain loop directly). The
epoch's log line goes to the console and to the run's log file; the bar only to a terminal.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from tqdm import tqdm

log = logging.getLogger(__name__)


class EpochProgress:
    """A tqdm bar per epoch on a terminal (rank 0), and one log line at every epoch end."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.show_bar = enabled and sys.stderr.isatty()
        self._bar: tqdm | None = None

    def start_epoch(self, title: str, *, total: int | None, done: int = 0) -> None:
        if self.show_bar:
            self._bar = tqdm(total=total, initial=done, desc=title, leave=False,
                             dynamic_ncols=True)

    def advance(self, steps: int = 1, shown: Mapping[str, float] | None = None) -> None:
        if self._bar is not None:
            if shown:
                self._bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()}, refresh=False)
            self._bar.update(steps)

    def end_epoch(self, title: str, summary: Mapping[str, float]) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.enabled:
            log.info("%s | %s", title, "  ".join(f"{k} {v:.4g}" for k, v in summary.items()))
