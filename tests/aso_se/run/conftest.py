"""Running search.py / train.py inside the test process, as ``python <script>.py ...`` does."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.aso_se.run.helpers import SMOKE, RunApp, run_in_process


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
    """``run_app("search", *overrides)`` -> (exit code, stderr), run in ``tmp_path`` (helpers.run_in_process)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)

    def run(entry_point: str, *overrides: str) -> tuple[int, str]:
        code = run_in_process(entry_point, *overrides, cwd=tmp_path)
        return code, capsys.readouterr().err

    return run


@pytest.fixture(scope="session")
def finished_search(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted smoke search (no loader workers), run once in-process for the session: the
    run test_bad_input.py damages copies of, and the genotype test_signals.py's resumed runs must end with."""
    run_dir = tmp_path_factory.mktemp("search") / "run"
    assert run_in_process("search", *SMOKE, f"hydra.run.dir={run_dir}", cwd=run_dir.parent) == 0
    assert (run_dir / "genotype.json").is_file()
    return run_dir
