"""Stop signals that arrive while an entry point is still importing and composing its config.

Until `aso_se.run.app.Run` installs its handlers, a SIGTERM would kill the process silently (the
default action). The entry points call `catch` first; the Run then stops at once with one line if
one came (see Run.__enter__). Imports nothing heavy, so it is in place within milliseconds.
"""
from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Any

# trainer.stop_signals' default; a run with another set gets the others back at their default action
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
_received: list[int] = []
_originals: dict[int, Any] = {}


def catch() -> None:
    """Record the stop signals from now on (a second one still acts at once, as its default)."""
    for signum in STOP_SIGNALS:
        previous = signal.signal(signum, _record)
        _originals.setdefault(signum, previous)


def original(signum: int, handler: Any) -> Any:
    """``handler``, or the one `catch` replaced when ``handler`` is ours (what a run restores at its end)."""
    return _originals.get(signum, handler) if handler is _record else handler


def _record(signum: int, frame: FrameType | None) -> None:
    if signum in _received:  # asked twice: do what the signal does without us
        signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler)
        os.kill(os.getpid(), signum)
        return
    _received.append(signum)


def take() -> int | None:
    """The first stop signal caught before the run took over, if any; forgotten once taken."""
    first = _received[0] if _received else None
    _received.clear()
    return first
