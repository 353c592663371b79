"""The handler the OS runs for a signal, which Python's ``signal.getsignal`` does not see.

A C library that calls sigaction() itself replaces Python's handler without Python knowing; a stop
signal would then kill the run silently (exit 143, no checkpoint). Seen on GPUs: LLVM inside
libtriton.so installs handlers for SIGINT, SIGTERM and SIGUSR1 when Triton first compiles a kernel
(a fresh cache); they remove LLVM's temporary files and re-raise the signal.
"""
from __future__ import annotations

import ctypes
import sys

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class _SigAction(ctypes.Structure):
    # glibc's struct sigaction begins with the handler on every Linux architecture; the rest
    # (mask, flags, restorer) is read into an opaque tail larger than any of them.
    _fields_ = [("handler", ctypes.c_void_p), ("rest", ctypes.c_byte * 256)]


def os_handler(signum: int) -> int | None:
    """The address of the handler the OS holds for ``signum`` (0: SIG_DFL); None off Linux."""
    if _LIBC is None:
        return None
    action = _SigAction()
    if _LIBC.sigaction(signum, None, ctypes.byref(action)) != 0:
        return None
    return action.handler or 0


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


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
