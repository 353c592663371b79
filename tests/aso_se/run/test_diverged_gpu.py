"""NaN/Inf under bf16 on a GPU: exit 3 with one line, the last good checkpoint kept and finite,
as on the CPU (test_bad_input.py). Both a NaN injected into the loss after a checkpoint and a
real divergence (a learning rate that overflows the weights)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aso_se.run import errors
from aso_se.run.checkpoint import load_checkpoint
from tests.aso_se.run.helpers import SMOKE, RunApp, nan_from_call

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
ON_GPU_BF16 = ["trainer.device=cuda", "trainer.precision=bf16", "hydra.run.dir=run"]



def _assert_diverged_with_a_finite_checkpoint(code: int, stderr: str, last: Path, kind: str) -> None:
    assert code == errors.EXIT_DIVERGED, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"last good checkpoint kept: {last}" in lines[0], stderr
    state = load_checkpoint(last, kind=kind)
    weights = state["engine"]["supernet"] if kind == "search" else state["trainer"]["model"]
    assert all(torch.isfinite(value).all() for value in weights.values() if value.is_floating_point())


@pytest.mark.parametrize(("entry_point", "overrides", "nan_from"), [
    ("search", [], 6),                                     # cycle 0's re-stabilization, after epoch 1's save
    ("train", ["genotype=DARTS_V2", "epochs=3"], 12),      # epoch 2 or 3, after epoch 1's save
])
def test_an_injected_nan_under_bf16(run_app: RunApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    entry_point: str, overrides: list[str], nan_from: int) -> None:
    nan_from_call(nan_from, monkeypatch)
    code, stderr = run_app(entry_point, *SMOKE, *ON_GPU_BF16, *overrides)
    _assert_diverged_with_a_finite_checkpoint(code, stderr, tmp_path / "run" / "checkpoints" / "last.pt",
                                              entry_point)


@pytest.mark.parametrize(("entry_point", "overrides"), [
    ("search", ["search.schedule.warmup_epochs=1", "search.schedule.cycles=3", "optim.weights.lr=1e37"]),
    ("train", ["genotype=DARTS_V2", "epochs=4", "optim.optimizer.lr=1e37"]),
])
def test_a_real_divergence_under_bf16(run_app: RunApp, tmp_path: Path, entry_point: str,
                                      overrides: list[str]) -> None:
    code, stderr = run_app(entry_point, *SMOKE, *ON_GPU_BF16, *overrides)
    assert code == errors.EXIT_DIVERGED, stderr
    assert len([line for line in stderr.splitlines() if line.strip()]) == 1, stderr
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    if last.is_file():
        _assert_diverged_with_a_finite_checkpoint(code, stderr, last, entry_point)
    else:
        assert "no checkpoint was saved yet" in stderr
