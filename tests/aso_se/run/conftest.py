"""Running search.py / train.py inside the test process, as ``python <script>.py ...`` does."""
from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.aso_se.run.helpers import REPO, RunApp


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny shapes gain nothing from intra-op threads, and threads that spin on a busy CPU
    (other test processes) slow in-process runs down by an order of magnitude."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def run_app(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            tmp_path: Path) -> RunApp:
    """``run_app("search", *overrides)`` -> (exit code, stderr), run in ``tmp_path``.

    ``runpy`` runs the script as ``__main__`` with a patched argv, so Hydra finds conf/ next to
    it exactly as for ``python search.py``; main_guard's HYDRA_FULL_ERROR does not leak out.
    """
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)

    def run(entry_point: str, *overrides: str) -> tuple[int, str]:
        script = str(REPO / f"{entry_point}.py")
        monkeypatch.setattr(sys, "argv", [script, *overrides])
        code = 0
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exited:
            code = exited.code
        finally:  # main_guard sets it for Hydra; subprocesses of later tests must not inherit it
            os.environ.pop("HYDRA_FULL_ERROR", None)
        return code, capsys.readouterr().err

    return run
