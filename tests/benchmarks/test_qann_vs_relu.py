"""benchmarks/qann_vs_relu.py: the --smoke run end to end (and one arm through submitit's local executor,
the Slurm path), and what it refuses."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from benchmarks import qann_vs_relu as bench
from benchmarks.common import BenchmarkError
from search_space.errors import UserInputError


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The --smoke run, one seed per arm; in-process (its multiruns are subprocesses anyway)."""
    out = tmp_path_factory.mktemp("qann") / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert bench.main(["--out", str(out), "--smoke", "--seeds", "1"]) == 0
    return out, stdout.getvalue()


@pytest.mark.slow
def test_smoke_run_reports_every_arm_and_the_verdicts(smoke):
    out, stdout = smoke
    summary = json.loads((out / "summary.json").read_text())
    assert [row["arm"] for row in summary["rows"]] == list(bench.ARMS) and all(r["n"] == 1 for r in summary["rows"])
    runs = {run["arm"]: run for run in summary["runs"]}
    for arm, run in runs.items():
        metrics = json.loads((out / "train" / f"{arm}_s0" / "metrics.json").read_text())
        assert run["test_acc"] == metrics["test_acc"] and run["seed"] == 0
    qann = runs["st_bif_qann"]
    assert qann["snn_test_acc"] == qann["test_acc"] and qann["snn_timesteps"] >= 1  # the exact SNN
    assert runs["relu"]["snn_test_acc"] is None and runs["st_bif"]["snn_test_acc"] is None
    assert "neuron.timesteps=4" in (out / "train" / "st_bif_s0" / ".hydra" / "overrides.yaml").read_text()
    assert "timesteps" not in (out / "train" / "relu_s0" / ".hydra" / "overrides.yaml").read_text()
    commands = [line for line in stdout.splitlines() if line.startswith("$ python train.py -m ")]
    assert len(commands) == 3 and commands[2].endswith("\"hydra.sweep.subdir='st_bif_s\\${seed}'\"")  # one per arm
    energy = qann["energy_per_image_uj"] / runs["relu"]["energy_per_image_uj"]
    assert [line.split("?")[0] for line in summary["verdicts"]] == [
        "QANN within 1 point of ReLU", "its SNN within 1 point of ReLU", "its binary SNN at T = 8 >= ReLU - 1",
        "its binary SNN at T = 4 >= ReLU - 2", f"its SNN's energy per image: {energy:.2f}x ReLU's",
        "QANN train time per image: "
        f"{runs['relu']['train_images_per_second'] / qann['train_images_per_second']:.2f}x ReLU's",
        "QANN above BPTT st_bif"]
    lines = stdout.strip().splitlines()
    assert lines[-3].startswith("| relu | 1 |") and lines[-1].startswith("| st_bif | 1 |")


@pytest.mark.slow
def test_an_arm_through_submitits_local_executor_equals_the_basic_launchers_run(smoke, tmp_path):
    """--launcher slurm_local: the Slurm path (hydra-submitit-launcher) with submitit's local executor."""
    out = tmp_path / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert bench.main(["--out", str(out), "--smoke", "--seeds", "1", "--arms", "relu", "--launcher",
                           "slurm_local"]) == 0
    assert "$ python train.py -m +sweep=slurm_local " in stdout.getvalue()
    assert (out / "train" / ".submitit").is_dir()
    (run,) = json.loads((out / "summary.json").read_text())["runs"]
    (basic,) = [r for r in json.loads((smoke[0] / "summary.json").read_text())["runs"] if r["arm"] == "relu"]
    assert run["test_acc"] == basic["test_acc"] and run["params_m"] == basic["params_m"]


def test_verdicts_compare_the_means():
    rows = [{"arm": "relu", "test_acc": 0.775, "snn_test_acc": None, "train_images_per_second": 6000.0},
            {"arm": "st_bif_qann", "test_acc": 0.760, "snn_test_acc": 0.766, "train_images_per_second": 5000.0},
            {"arm": "st_bif", "test_acc": 0.667, "snn_test_acc": None, "train_images_per_second": 1500.0}]
    assert bench.verdicts(rows) == [
        "QANN within 1 point of ReLU? NO (-1.50 points)", "its SNN within 1 point of ReLU? YES (-0.90 points)",
        "QANN train time per image: 1.20x ReLU's", "QANN above BPTT st_bif? YES (+9.30 points)"]


def test_the_binary_snn_verdicts_against_relu():
    """The binary SNN's targets: at T = 8 within 1 point of the ReLU network, at T = 4 within 2, and its energy."""
    rows = [{"arm": "relu", "test_acc": 0.9, "snn_test_acc": None, "train_images_per_second": 6000.0,
             "energy_per_image_uj": 200.0},
            {"arm": "st_bif_qann:level=4:snn_finetune.epochs=2", "test_acc": 0.89, "snn_test_acc": 0.89,
             "snn_acc_t4": 0.875, "snn_acc_t8": 0.8875, "energy_per_image_uj": 100.0,
             "train_images_per_second": 5000.0}]
    assert bench.verdicts(rows)[2:5] == [
        "its binary SNN at T = 8 >= ReLU - 1? NO (-1.25 points)",
        "its binary SNN at T = 4 >= ReLU - 2? NO (-2.50 points)", "its SNN's energy per image: 0.50x ReLU's"]


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
    assert bench.arm_overrides("st_bif_qann:level=4:snn_finetune.epochs=2", 4) == (
        "neuron=st_bif_qann", "neuron.level=4", "snn_finetune.epochs=2")
    (sweep,) = bench.plan_sweeps(Path("/o"), ["st_bif_qann:level=16"], 2, 4, ("epochs=1",))
    assert sweep.run_dirs() == [Path("/o/train/st_bif_qann_level16_s0"), Path("/o/train/st_bif_qann_level16_s1")]
    assert sweep.command()[3:] == ["epochs=1", "neuron=st_bif_qann", "neuron.level=16", "seed=0,1",
                                   "hydra.sweep.dir='/o/train'", "hydra.sweep.subdir='st_bif_qann_level16_s${seed}'"]
    rows = [{"arm": "relu", "test_acc": 0.775, "snn_test_acc": None, "train_images_per_second": 6000.0},
            {"arm": "st_bif_qann:level=16", "test_acc": 0.770, "snn_test_acc": 0.771,
             "train_images_per_second": 5000.0}]
    assert bench.verdicts(rows) == [
        "QANN (st_bif_qann:level=16) within 1 point of ReLU? YES (-0.50 points)",
        "its SNN within 1 point of ReLU? YES (-0.40 points)",
        "QANN (st_bif_qann:level=16) train time per image: 1.20x ReLU's"]


def test_the_run_settings_an_arm_sets_itself_are_not_a_budget_difference(tmp_path):
    """A warm start runs fewer epochs at its own learning rate: one budget still, the neuron options aside."""
    arms = ["relu", "st_bif_qann:level=4:init_from=relu:epochs=10:optim.optimizer.lr=0.02:snn_finetune.epochs=2"]
    assert bench.arm_run_keys(arms) == ("epochs", "init_from", "optim.optimizer.lr", "snn_finetune.epochs")

    def run_dir(name: str, config: str) -> Path:
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "config.yaml").write_text(config)
        return tmp_path / name

    relu = run_dir("relu", "seed: 0\nepochs: 100\nneuron: {name: relu}\noptim: {optimizer: {lr: 0.3, wd: 0.0005}}\n")
    warm = run_dir("warm", "seed: 0\nepochs: 10\ninit_from: /o/relu\nneuron: {name: st_bif_qann, level: 4}\n"
                           "optim: {optimizer: {lr: 0.02, wd: 0.0005}}\n")
    ignore = ("neuron", "snn_finetune", "seed", *bench.arm_run_keys(arms))
    assert bench.same_config([relu, warm], ignore=ignore) == {"optim": {"optimizer": {"wd": 0.0005}}}
    other = run_dir("other", "seed: 0\nepochs: 10\nneuron: {name: relu}\noptim: {optimizer: {lr: 0.3, wd: 0.0001}}\n")
    with pytest.raises(BenchmarkError, match="ran with different configs"):
        bench.same_config([relu, warm, other], ignore=ignore)  # a weight decay no arm sets is a difference


def test_a_warm_started_arm_starts_each_seed_from_an_earlier_arms_run_of_that_seed():
    assert bench.arm_overrides("st_bif_qann:level=4:init_from=relu:threshold_init=lsq", 4) == (
        "neuron=st_bif_qann", "neuron.level=4", "init_from=relu", "threshold_init=lsq")
    relu, warm = bench.plan_sweeps(Path("/o"), ["relu", "st_bif_qann:level=4:init_from=relu:threshold_init=lsq"], 2, 4,
                                   ("epochs=1",))
    assert "init_from=/o/train/relu_s${seed}" in warm.overrides and not any("init_from" in o for o in relu.overrides)
    _, taught = bench.plan_sweeps(Path("/o"), ["relu", "st_bif_qann:distill.teacher=relu"], 1, 4, ())
    assert "distill.teacher=/o/train/relu_s${seed}" in taught.overrides
    (alone,) = bench.plan_sweeps(Path("/o"), ["st_bif_qann:init_from=/runs/relu"], 1, 4, ())
    assert "init_from=/runs/relu" in alone.overrides  # a run dir, not an arm: as given
    (short,) = bench.plan_sweeps(Path("/o"), ["st_bif_qann:epochs=5"], 1, 4, ("epochs=10",))
    assert short.overrides[-1] == "epochs=5"  # the arm's own epochs, after the common ones: Hydra keeps the last
