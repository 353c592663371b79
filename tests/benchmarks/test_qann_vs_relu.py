"""benchmarks/qann_vs_relu.py: the --smoke run end to end, and what it refuses."""
from __future__ import annotations

import json

import pytest

from benchmarks import qann_vs_relu as bench
from search_space.errors import UserInputError


def test_smoke_run_reports_every_arm_and_the_verdicts(tmp_path, capsys):
    out = tmp_path / "out"
    # In-process: its runs are subprocesses anyway; this spares the benchmark's own start-up.
    assert bench.main(["--out", str(out), "--smoke", "--seeds", "1", "--parallel", "2"]) == 0
    stdout = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert [row["arm"] for row in summary["rows"]] == list(bench.ARMS) and all(r["n"] == 1 for r in summary["rows"])
    runs = {run["arm"]: run for run in summary["runs"]}
    for arm, run in runs.items():
        metrics = json.loads((out / f"{arm}_s0" / "metrics.json").read_text())
        assert run["test_acc"] == metrics["test_acc"] and run["seed"] == 0
    qann = runs["st_bif_qann"]
    assert qann["snn_test_acc"] == qann["test_acc"] and qann["snn_timesteps"] >= 1  # the exact SNN
    assert runs["relu"]["snn_test_acc"] is None and runs["st_bif"]["snn_test_acc"] is None
    assert "neuron.timesteps=4" in (out / "st_bif_s0" / ".hydra" / "overrides.yaml").read_text()
    assert "timesteps" not in (out / "relu_s0" / ".hydra" / "overrides.yaml").read_text()
    assert [line.split("?")[0] for line in summary["verdicts"]] == [
        "QANN within 1 point of ReLU", "its SNN within 1 point of ReLU", "QANN train time per image: "
        f"{runs['relu']['train_images_per_second'] / qann['train_images_per_second']:.2f}x ReLU's",
        "QANN above BPTT st_bif"]
    lines = stdout.strip().splitlines()
    assert lines[-3].startswith("| relu | 1 |") and lines[-1].startswith("| st_bif | 1 |")


def test_verdicts_compare_the_means():
    rows = [{"arm": "relu", "test_acc": 0.775, "snn_test_acc": None, "train_images_per_second": 6000.0},
            {"arm": "st_bif_qann", "test_acc": 0.760, "snn_test_acc": 0.766, "train_images_per_second": 5000.0},
            {"arm": "st_bif", "test_acc": 0.667, "snn_test_acc": None, "train_images_per_second": 1500.0}]
    assert bench.verdicts(rows) == [
        "QANN within 1 point of ReLU? NO (-1.50 points)", "its SNN within 1 point of ReLU? YES (-0.90 points)",
        "QANN train time per image: 1.20x ReLU's", "QANN above BPTT st_bif? YES (+9.30 points)"]


@pytest.mark.parametrize("override", ["neuron=lif", "seed=3", "hydra.run.dir=x"])
def test_overrides_the_benchmark_sets_are_refused(override):
    with pytest.raises(UserInputError, match="sets"):
        bench.check_overrides([override])


def test_an_unknown_arm_is_refused_before_any_run(tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path / "out"), "--smoke", "--arms", "relu,sigmoid"]) == 2
    assert "neuron=sigmoid" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_an_arm_with_neuron_options_runs_them_and_gets_its_own_verdicts():
    assert bench.arm_overrides("st_bif_qann:level=16:q_threshold=0.25", 4) == (
        "neuron=st_bif_qann", "neuron.level=16", "neuron.q_threshold=0.25")
    assert bench.arm_overrides("st_bif", 2) == ("neuron=st_bif", "neuron.timesteps=2")
    jobs = bench.plan_jobs(bench.Path("/o"), ["st_bif_qann:level=16"], 1, 4, ("epochs=1",))
    assert jobs[0].name == "st_bif_qann_level16_s0" and "neuron.level=16" in jobs[0].overrides
    rows = [{"arm": "relu", "test_acc": 0.775, "snn_test_acc": None, "train_images_per_second": 6000.0},
            {"arm": "st_bif_qann:level=16", "test_acc": 0.770, "snn_test_acc": 0.771,
             "train_images_per_second": 5000.0}]
    assert bench.verdicts(rows) == [
        "QANN (st_bif_qann:level=16) within 1 point of ReLU? YES (-0.50 points)",
        "its SNN within 1 point of ReLU? YES (-0.40 points)",
        "QANN (st_bif_qann:level=16) train time per image: 1.20x ReLU's"]
