"""Under torchrun: a rank whose main thread cannot reach the end of its step after a stop signal.

When a rank dies, torchrun sends SIGTERM to the others and SIGKILL 30 s later. A survivor whose main
thread waits on the GPU for a collective the dead rank never joins (NCCL: no error, only a wait)
cannot run Python's signal handler, so it would be killed without a word. The signal also wakes this
watchdog thread (``signal.set_wakeup_fd``); if the main thread has not taken the stop within
``grace_s``, the watchdog writes one line and ends the process.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable


class StuckRankWatchdog:
    """Started once the run's stop handlers are in place; the main thread calls `stop_taken` at the
    end of the step after a stop signal."""

    def __init__(self, signums: tuple[int, ...], *, grace_s: float, message: Callable[[int], str],
                 exit_code: int) -> None:
        self.signums, self.grace_s, self.message, self.exit_code = signums, grace_s, message, exit_code
        self._taken = threading.Event()
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="stuck-rank-watchdog", daemon=True).start()

    def stop_taken(self) -> None:
        self._taken.set()

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        self._taken.set()
        os.close(self._write)  # wakes the thread with end-of-file

    def _watch(self) -> None:
        while True:  # every signal with a Python handler writes its number (SIGCHLD of loader workers too)
            data = os.read(self._read, 1)
            if not data or data[0] in self.signums:
                break
        os.close(self._read)
        if not data or self._taken.wait(self.grace_s):
            return
        sys.stderr.write(self.message(data[0]))
        sys.stderr.flush()
        os._exit(self.exit_code)
