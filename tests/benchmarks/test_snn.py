"""benchmarks/snn.py (the SNN suite) on a smoke QANN run: one row per spikes-per-step, the same final accuracy,
fewer steps with graded spikes, and bad input refused."""
from __future__ import annotations

import json

import pytest

from benchmarks import report
from benchmarks import snn as bench
from benchmarks.rows import read_rows
from tests.aso_se.run.helpers import SMOKE, run_in_process


@pytest.fixture(scope="module")
def qann_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("qann")
    code = run_in_process("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann",
                          "snn_max_timesteps=1", "hydra.run.dir=run", cwd=cwd)
    assert code == 0
    return cwd / "run"


@pytest.fixture(scope="module")
def relu_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("relu")
    assert run_in_process("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=relu", "hydra.run.dir=run",
                          cwd=cwd) == 0
    return cwd / "run"


def test_graded_spikes_reach_the_same_accuracy_in_fewer_steps(qann_run, relu_run, tmp_path, capsys):
    out = tmp_path / "out"
    assert bench.main(["--run", str(qann_run), "--spikes-per-step", "1,15", "--samples", "20",
                       "--batch-size", "10", "--out", str(out), "--relu-run", str(relu_run), "--case", "smoke",
                       "--rows-out", str(tmp_path / "rows.csv")]) == 0
    report = json.loads((out / "snn_latency.json").read_text())
    binary, graded = report["rows"]
    assert report["images"] == 20 and (binary["spikes_per_step"], graded["spikes_per_step"]) == (1, 15)
    for row in (binary, graded):
        assert row["silent"] and row["snn_accuracy"] == row["qann_accuracy"]
    assert graded["timesteps_to_silence"] == 1 < binary["timesteps_to_silence"]  # 15 = the default levels - 1
    assert graded["accuracy_at"]["1"] == graded["qann_accuracy"]
    energies = [energy for row in (binary, graded) for energy in row["energy_uj_at"].values()]
    assert all(0 < energy["unit_sops"] <= energy["skip_zero"] <= energy["dense"] for energy in energies)
    assert any(energy["unit_sops"] < energy["skip_zero"] for energy in graded["energy_uj_at"].values())
    assert set(binary["energy_uj_at"]) == {str(min(8, binary["timesteps_to_silence"])),
                                           str(binary["timesteps_to_silence"])}
    relu = report["relu"]
    assert 0 < relu["energy_uj"]["skip_zero"] < relu["energy_uj"]["dense"] and 0 <= relu["test_acc"] <= 1
    assert relu["energy_uj"]["unit_sops"] == relu["energy_uj"]["skip_zero"]  # real activations: no spikes to read
    stdout = capsys.readouterr().out.splitlines()
    assert stdout[2].startswith("| 1 |") and stdout[-2].startswith("ReLU network")
    rows = {row["metric"]: row for row in read_rows(tmp_path / "rows.csv")}  # the suite's result rows
    assert stdout[-1] == f"{len(rows)} rows appended to {tmp_path / 'rows.csv'}"
    assert {row["case"] for row in rows.values()} == {"smoke"}
    assert float(rows["15 spikes per step, T = 1: accuracy"]["value"]) == round(100 * graded["qann_accuracy"], 2)
    assert rows["1 spike per step (binary ST-BIF): steps to silence"]["value"] == str(binary["timesteps_to_silence"])
    assert float(rows["ReLU ANN: energy per image, dense MACs"]["value"]) == round(relu["energy_uj"]["dense"], 1)
    assert (out / "snn_latency.md").read_text().startswith("| spikes per step |")
    assert (out / "snn_latency.png").stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    curve = events.Scalars("snn_latency/accuracy_m1")
    assert [e.step for e in curve] == sorted(int(t) for t in binary["accuracy_at"])
    assert curve[-1].value == pytest.approx(100 * binary["snn_accuracy"])
    assert {"snn_latency/accuracy_m15", "snn_latency/qann_accuracy", "snn_latency/relu_accuracy"} <= set(
        events.Tags()["scalars"])


def test_bad_input_is_refused(qann_run, relu_run, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--run", str(qann_run), "--spikes-per-step", "two"])
    assert "--spikes-per-step 'two'" in capsys.readouterr().err
    assert bench.main(["--run", str(qann_run), "--spikes-per-step", "0", "--samples", "10",
                       "--out", str(tmp_path), "--rows-out", ""]) == 2
    assert "spikes_per_step=0" in capsys.readouterr().err
    assert bench.main(["--run", str(tmp_path / "nowhere"), "--rows-out", ""]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert bench.main(["--run", str(relu_run), "--samples", "10", "--out", str(tmp_path), "--rows-out", ""]) == 2
    assert "trained neuron=relu; pass a neuron=st_bif_qann run" in capsys.readouterr().err


def test_a_fine_tuned_run_says_what_its_snn_stage_costs(relu_run, tmp_path):
    """A QANN run with fine-tuning records its wall clock as each stage ends, in order; --from-metrics turns the marks
    into the SNN stage's seconds and its share of the QANN's training (and of the ReLU's and the QANN's)."""
    assert run_in_process("train", *SMOKE, "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann", "neuron.level=4",
                          "snn_max_timesteps=4", "snn_finetune.epochs=1", "snn_finetune.timesteps=2",
                          "hydra.run.dir=run", cwd=tmp_path) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    marks = metrics["wall_time_marks_s"]
    order = ["trained", "snn_evaluated", "energy_measured", "finetuned", "finetune_evaluated",
             "finetune_energy_measured"]
    assert list(marks) == order and all(0 < a <= b for a, b in zip(marks.values(), list(marks.values())[1:]))
    assert marks["finetune_energy_measured"] <= metrics["wall_time_s"]
    assert "energy_per_image_uj" in metrics["snn_finetune"]
    out = tmp_path / "rows.csv"
    assert bench.main(["--from-metrics", "--run", str(tmp_path / "run"), "--relu-run", str(relu_run),
                       "--case", "smoke", "--rows-out", str(out)]) == 0
    found = {row["metric"]: float(row["value"]) for row in read_rows(out)}
    what = "SNN stage (converted SNN's evaluation, fine-tuning, fine-tuned SNN's evaluation)"
    stage = (marks["snn_evaluated"] - marks["trained"]) + (marks["finetune_evaluated"] - marks["energy_measured"])
    assert found[f"{what}: wall"] == pytest.approx(stage, abs=0.05)
    assert found["QANN training: wall"] == pytest.approx(marks["trained"], abs=0.05)
    assert found[f"{what} / QANN training"] == pytest.approx(100 * stage / marks["trained"], abs=0.05)
    relu_trained = json.loads((relu_run / "metrics.json").read_text())["wall_time_marks_s"]["trained"]
    assert found[f"{what} / ReLU and QANN training"] == pytest.approx(
        100 * stage / (relu_trained + marks["trained"]), abs=0.05)
    for target in report.binary_snn_targets("DARTS_V2", "smoke"):  # RESULTS' standing reads these rows by name
        assert report.standing(target, "smoke", read_rows(out)) is not None, target.what
