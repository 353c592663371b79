"""trainer.precision=bf16: both entry points run their forward passes under bf16 autocast."""
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
