"""Shared by the apps tests: where the entry points are, the smoke overrides, and running one in-process."""
import os
import runpy
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from aso_se.run import stop_signals

REPO = Path(__file__).resolve().parents[3]
SMOKE = ["experiment=smoke", "logger=none"]
RunApp = Callable[..., tuple[int, str]]  # run_app("search", *overrides) -> (exit code, stderr)


def run_in_process(entry_point: str, *overrides: str, cwd: Path) -> int:
    """``python <entry_point>.py <overrides>`` run in ``cwd`` inside this process; its exit code.

    ``runpy`` runs the script as ``__main__`` with a patched argv, so Hydra finds conf/ next to
    it exactly as for ``python search.py``; main_guard's HYDRA_FULL_ERROR does not leak out.
    Usable from fixtures of any scope (the function-scoped ``run_app`` adds the captured stderr).
    """
    script = str(REPO / f"{entry_point}.py")
    # The entry point catches stop signals first thing (stop_signals.catch_early); a run that fails before its Run
    # takes over would leave that handler in this process.
    handlers = {signum: signal.getsignal(signum) for signum in stop_signals.STOP_SIGNALS}
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(cwd)
        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
        monkeypatch.setattr(sys, "argv", [script, *overrides])
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exited:
            return exited.code
        finally:  # main_guard sets it for Hydra; subprocesses of later tests must not inherit it
            os.environ.pop("HYDRA_FULL_ERROR", None)
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            stop_signals.take_early()
    return 0


def nan_from_call(call: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the cross-entropy NaN from its ``call``-th call on (a diverging run)."""
    import torch

    real = torch.nn.functional.cross_entropy
    calls = 0

    def cross_entropy(*args, **kwargs):
        nonlocal calls
        calls += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls >= call else loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", cross_entropy)
