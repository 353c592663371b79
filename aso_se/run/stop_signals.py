"""Stop signals (``trainer.stop_signals``): a signal ends the run after its step, with a checkpoint.

From the moment an entry point starts, `catch_early` records the default stop signals, so a SIGTERM while
it imports and composes its config is a stop, not a silent death (the default action). The run then
installs a `StopHandler`, which only raises a stop flag: the training loop polls it after each step, and
the entry point saves and raises `Interrupted`. A second Ctrl-C quits at once. Loader workers ignore the
stop signals, so a signal to the whole process group stops the run the same way.

A C library that calls sigaction() itself replaces Python's handler without Python knowing; a stop
signal would then kill the run silently (exit 143, no checkpoint). Seen on GPUs: LLVM inside
libtriton.so installs handlers for SIGINT, SIGTERM and SIGUSR1 when Triton first compiles a kernel
(a fresh cache); they remove LLVM's temporary files and re-raise the signal. `os_handler` reads the
handler the OS holds, and the StopHandler puts its own back.

Imports nothing heavy: the entry points import it before torch.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from aso_se.parallel.stuck_rank import StuckRankWatchdog
from search_space.errors import UserInputError

log = logging.getLogger(__name__)

# trainer.stop_signals' default; a run with another set gets the others back at their default action
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# A second SIGINT within this many seconds is the same stop: `timeout -s INT` signals its child
# and then the child's whole group, so the main process can see the signal twice.
_REPEAT_WINDOW_S = 0.5
# Under torchrun: how long after a stop signal a rank may take to end its step before the watchdog
# ends it with one line (below torchrun's 30 s between its SIGTERM and SIGKILL; see stuck_rank).
STUCK_RANK_GRACE_S = 20.0

_received_early: list[int] = []
_replaced_early: dict[int, Any] = {}


def catch_early() -> None:
    """Record the stop signals from now on (a second one still acts at once, as its default)."""
    for signum in STOP_SIGNALS:
        previous = signal.signal(signum, _record_early)
        _replaced_early.setdefault(signum, previous)


def _record_early(signum: int, frame: FrameType | None) -> None:
    if signum in _received_early:  # asked twice: do what the signal does without us
        signal.signal(signum, signal.SIG_DFL if signum != signal.SIGINT else signal.default_int_handler)
        os.kill(os.getpid(), signum)
        return
    _received_early.append(signum)


def take_early() -> int | None:
    """The first stop signal caught before the run took over, if any; forgotten once taken."""
    first = _received_early[0] if _received_early else None
    _received_early.clear()
    return first


def parse_stop_signals(names: Any) -> tuple[int, ...]:
    """``trainer.stop_signals`` (e.g. [SIGTERM, SIGINT, USR1]) as signal numbers."""
    if isinstance(names, str) or not all(isinstance(name, str) for name in names or []):
        raise UserInputError(f"trainer.stop_signals={names} is not a list of signal names; "
                             f"write e.g. trainer.stop_signals=[SIGTERM,SIGINT,SIGUSR1]")
    signums = []
    for name in names:
        full = name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"
        signum = getattr(signal.Signals, full, None)
        if signum is None or signum in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            raise UserInputError(f"trainer.stop_signals: {name} is not a signal a run can stop on; "
                                 f"use e.g. SIGTERM, SIGINT, SIGUSR1, SIGUSR2 or SIGHUP")
        signums.append(int(signum))
    return tuple(dict.fromkeys(signums))


class StopHandler:
    """The handler of one run's stop signals; ``signum`` is the first one received (None: no stop yet).

    ``quit_at_once(signum)``: the exception a second Ctrl-C raises, naming what the run has saved.
    """

    def __init__(self, quit_at_once: Callable[[int], BaseException]) -> None:
        self.signum: int | None = None
        self._signalled_at = 0.0
        self._pid = os.getpid()
        self._quit_at_once = quit_at_once
        self._previous_handlers: dict[int, Any] = {}
        self._os_handlers: dict[int, int | None] = {}  # what the OS runs for them: Python's C handler
        self._previous_worker_signals: tuple[int, ...] | None = None
        self._watchdog: StuckRankWatchdog | None = None

    @property
    def signums(self) -> tuple[int, ...]:
        return tuple(self._previous_handlers)

    def install(self, signums: tuple[int, ...]) -> None:
        """Handle ``signums`` from now on (the set a resumed run saved may differ); workers will ignore them."""
        # Imported here, not at the top: the entry points import this module before torch and Triton.
        from triton import knobs as triton_knobs

        from aso_se.data import loaders

        for signum in signums:  # a resumed run may change the set: keep the original handlers
            previous = signal.signal(signum, self._on_signal)
            if previous is _record_early:
                previous = _replaced_early.get(signum, previous)
            self._previous_handlers.setdefault(signum, previous)
            self._os_handlers[signum] = os_handler(signum)
        for signum in set(self._previous_handlers) - set(signums):
            signal.signal(signum, self._previous_handlers.pop(signum))
        previous_worker_signals = loaders.ignore_in_workers(signums)
        if self._previous_worker_signals is None:
            self._previous_worker_signals = previous_worker_signals
        if signums:  # LLVM in libtriton installs its own stop handlers (they kill) when it first compiles
            triton_knobs.runtime.kernel_load_end_hook.add(self._after_kernel_load)

    def watch_for_stuck_ranks(self, message: Callable[[int], str], exit_code: int) -> None:
        """Under torchrun: a stop signal that the step does not take within `STUCK_RANK_GRACE_S` ends the
        process with ``message(signum)`` (aso_se.parallel.stuck_rank)."""
        self._watchdog = StuckRankWatchdog(self.signums, grace_s=STUCK_RANK_GRACE_S, message=message,
                                           exit_code=exit_code)

    def step_ended(self) -> bool:
        """After every step: whether a stop signal came (then the watchdog knows this rank's step ended)."""
        self.keep_installed()
        if self.signum is not None and self._watchdog is not None:
            self._watchdog.stop_taken()  # this rank's step ended: it will save and stop, not hang
        return self.signum is not None

    def restore(self) -> None:
        """The handlers from before `install`; loader workers built later no longer ignore the signals."""
        from triton import knobs as triton_knobs

        from aso_se.data import loaders

        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
        triton_knobs.runtime.kernel_load_end_hook.remove(self._after_kernel_load)
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()
        self._os_handlers.clear()
        if self._previous_worker_signals is not None:
            loaders.ignore_in_workers(self._previous_worker_signals)
            self._previous_worker_signals = None

    def signalled_while_starting(self) -> int | None:
        """The stop signal that came before `install`, if any; another signal caught early gets its default action."""
        signum = take_early()
        if signum is None:
            return None
        if signum not in self._previous_handlers:  # not a stop signal of this run: its default action
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return None
        log.warning("%s received while starting: stopping before the run begins", signal.Signals(signum).name)
        return signum

    def _after_kernel_load(self, *args: Any) -> None:
        if threading.current_thread() is threading.main_thread():  # signal.signal's rule; else the next step's check
            self.keep_installed()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A DataLoader worker between its fork and its init function: the main process
            # stops the run and shuts the worker down.
            return
        now = time.monotonic()
        if self.signum is not None:
            # Only a person's second Ctrl-C quits at once. Schedulers repeat their signal (timeout,
            # torchrun's agent) or escalate (Slurm: USR1, then TERM) and SIGKILL when they mean it.
            if signum == signal.SIGINT and now - self._signalled_at >= _REPEAT_WINDOW_S:
                raise self._quit_at_once(signum)
            return
        self.signum, self._signalled_at = signum, now
        log.warning("%s received: saving a checkpoint after this step (Ctrl-C again to quit at once)",
                    signal.Signals(signum).name)

    def keep_installed(self) -> None:
        """Puts back a stop handler that something in the process replaced, and names the replacement:
        a signal caught by another handler (or none) would end the run without its checkpoint."""
        for signum in self._previous_handlers:
            current = signal.getsignal(signum)
            if current != self._on_signal:
                log.warning("the %s handler was replaced by %r; the run's stop handler is back",
                            signal.Signals(signum).name, current)
                signal.signal(signum, self._on_signal)
            elif (replacement := os_handler(signum)) != self._os_handlers.get(signum):  # sigaction() unseen by Python
                log.warning("the %s handler was replaced outside Python (by %s); the run's stop handler is back",
                            signal.Signals(signum).name, describe_handler(replacement))
                signal.signal(signum, self._on_signal)


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class _SigAction(ctypes.Structure):
    # glibc's struct sigaction begins with the handler on every Linux architecture; the rest
    # (mask, flags, restorer) is read into an opaque tail larger than any of them.
    _fields_ = [("handler", ctypes.c_void_p), ("rest", ctypes.c_byte * 256)]


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def os_handler(signum: int) -> int | None:
    """The address of the handler the OS holds for ``signum`` (0: SIG_DFL); None off Linux."""
    if _LIBC is None:
        return None
    action = _SigAction()
    if _LIBC.sigaction(signum, None, ctypes.byref(action)) != 0:
        return None
    return action.handler or 0


def describe_handler(address: int | None) -> str:
    """``symbol in library`` for a handler address (dladdr), to name who installed it."""
    if not address:
        return {0: "SIG_DFL", 1: "SIG_IGN"}.get(address or 0, "unknown")
    if _LIBC is None:
        return hex(address)
    info = _DlInfo()
    if not _LIBC.dladdr(ctypes.c_void_p(address), ctypes.byref(info)):
        return hex(address)
    symbol = info.dli_sname.decode() if info.dli_sname else hex(address)
    library = info.dli_fname.decode() if info.dli_fname else "?"
    return f"{symbol} in {library}"
