"""benchmarks/energy_pareto.py: the --smoke λ sweep end to end, the Pareto front and bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import energy_pareto as sweep


@pytest.mark.slow
def test_smoke_sweep_lowers_the_energy_of_the_found_cell(tmp_path, capsys):
    out = tmp_path / "out"
    # In-process: its multiruns are subprocesses anyway; this spares the sweep's own start-up.
    assert sweep.main(["--out", str(out), "--smoke", "--weights", "0,20"]) == 0
    stdout = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    plain, frugal = summary["rows"]
    assert (plain["energy_weight"], frugal["energy_weight"]) == (0.0, 20.0) and plain["n"] == frugal["n"] == 1
    assert frugal["energy_uj"] < plain["energy_uj"]  # λ = 20 buys a cheaper cell
    for run in summary["runs"]:
        metrics = json.loads((Path(run["run_dir"]) / "metrics.json").read_text())
        assert run["energy_per_image_uj"] == metrics["energy_per_image_uj"] and run["genotype"]
    assert "search.energy_weight=20.0" in (out / "search" / "w20.0_s0" / ".hydra" / "overrides.yaml").read_text()
    frugal_run = next(run for run in summary["runs"] if run["energy_weight"] == 20.0)
    assert frugal_run["run_dir"] == str(out / "retrain" / "w20.0_s0") and frugal_run["search_seed"] == 0
    # the retrain trained the cell its search found (the genotype copied to DIR/genotypes/)
    assert frugal_run["genotype"] == json.loads((out / "search" / "w20.0_s0" / "genotype.json").read_text())
    assert [line[:26] for line in stdout.splitlines() if line.startswith("$ ")] == [
        "$ python search.py -m expe", "$ python train.py -m exper"]
    assert (out / "pareto.png").stat().st_size > 0 and "| 20 | 1 |" in (out / "summary.md").read_text()
    assert stdout.strip().splitlines()[-1].startswith("| 20 |")


def test_pareto_front():
    points = [(1.0, 0.5), (2.0, 0.6), (3.0, 0.55), (0.5, 0.4), (2.0, 0.6)]
    assert sweep.pareto_front(points) == [0, 1, 3, 4]  # (3.0, 0.55) costs more than (2.0, 0.6) for less


@pytest.mark.parametrize("text", ["a,b", "-1,0", "1,1"])
def test_bad_weights_are_refused(tmp_path, text, capsys):
    assert sweep.main(["--out", str(tmp_path / "o"), "--smoke", f"--weights={text}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("energy_pareto: --weights") and not (tmp_path / "o").exists()
