"""trainer.precision: bf16 autocast in both entry points; fp16 (with loss scaling) in train.py, refused by search.py."""
import json
from pathlib import Path

import pytest

from tests.aso_se.run.helpers import SMOKE, RunApp


@pytest.mark.parametrize("entry_point", [pytest.param("search", marks=pytest.mark.slow), "train"])
def test_bf16_autocast_runs(entry_point: str, run_app: RunApp, tmp_path: Path) -> None:
    genotype = ["genotype=DARTS_V2"] if entry_point == "train" else []
    code, stderr = run_app(entry_point, *SMOKE, *genotype, "trainer.precision=bf16",
                           "hydra.run.dir=run")
    assert code == 0, stderr
    if entry_point == "train":
        assert json.loads((tmp_path / "run" / "metrics.json").read_text())["precision"] == "bf16"


def test_fp16_trains_and_the_search_refuses_it_in_one_line(run_app: RunApp, tmp_path: Path) -> None:
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "trainer.precision=fp16", "hydra.run.dir=run")
    assert code == 0, stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["precision"] == "fp16" and metrics["test_acc"] >= 0
    code, stderr = run_app("search", *SMOKE, "trainer.precision=fp16", "hydra.run.dir=search")
    assert code == 2
    assert "trainer.precision=fp16 is not supported by search.py; use fp32 or bf16" in stderr
