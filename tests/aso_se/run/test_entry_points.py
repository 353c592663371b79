"""search.py and train.py end to end, as users run them, on real mnist5k digits.

One smoke search (``experiment=smoke``) is shared by the module; the other runs are a retrain
of its genotype, a search stopped by Ctrl-C and resumed, and 2-process DDP runs. What depends on
the process (a signal to its group, torchrun) runs in real subprocesses; runs judged only by what
they write run in this process (helpers.run_in_process), which spares each the start-up's imports.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from aso_se.run.checkpoint import load_checkpoint
from aso_se.run.search_callbacks import alpha_digest
from search_space.genotypes import Genotype
from tests.aso_se.run.helpers import REPO, run_in_process

SMOKE = ["experiment=smoke"]


def _env() -> dict[str, str]:
    # One thread per process: the tests run several processes on two cores.
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _only_run_dir(root: Path) -> Path:
    (run_dir,) = root.iterdir()
    return run_dir


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the entry points run in: their outputs/ goes here."""
    return tmp_path_factory.mktemp("apps")


@pytest.fixture(scope="module")
def smoke_search(workdir: Path) -> Path:
    assert run_in_process("search", *SMOKE, cwd=workdir) == 0
    return _only_run_dir(workdir / "outputs" / "search")


def test_search_writes_genotype_checkpoint_and_tensorboard(smoke_search: Path) -> None:
    genotype = Genotype.from_json((smoke_search / "genotype.json").read_text())
    cycles = sorted(path.name for path in (smoke_search / "genotypes").iterdir())
    assert cycles == ["cycle_0.json", "cycle_1.json"]
    assert Genotype.from_json((smoke_search / "genotypes" / "cycle_1.json").read_text()) == genotype
    state = load_checkpoint(smoke_search / "checkpoints" / "last.pt", kind="search")
    assert state["engine"]["position"] > 0 and state["config"]["batch_size"] == 16
    assert (smoke_search / ".hydra" / "config.yaml").is_file()
    assert "cycle 1 search" in (smoke_search / "search.log").read_text()

    events = EventAccumulator(str(smoke_search / "tb"), size_guidance={"images": 0})
    events.Reload()
    tags = events.Tags()
    assert {"search/loss", "search/arch_loss", "search/temperature", "search/entropy",
            "search_epoch/images_per_second", "search_epoch/end_seconds"} <= set(tags["scalars"])
    images = {"alpha/normal", "alpha/reduce", "genotype/normal", "genotype/reduce"}
    assert images <= set(tags["images"])
    # every alpha_figure_every_n_epochs-th epoch, and each cycle's end (2 cycles here)
    cycle_ends = [event.step for event in events.Images("genotype/normal")]
    alpha_steps = [event.step for event in events.Images("alpha/normal")]
    assert len(cycle_ends) == 2 and set(cycle_ends) <= set(alpha_steps)
    assert any(tag.startswith("firing_rate/cells.") for tag in tags["histograms"])


def test_train_retrains_the_newest_searched_genotype(workdir: Path, smoke_search: Path) -> None:
    assert run_in_process("train", *SMOKE, cwd=workdir) == 0
    run_dir = _only_run_dir(workdir / "outputs" / "train")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0.0 <= metrics["test_acc"] <= 1.0 and metrics["epochs"] == 1
    assert 0.0 < metrics["params_m"] < 0.1 and metrics["train_images_per_second"] > 0
    assert metrics["sparse_conv_paths"]["dense:requested"] > 0  # every conv call (cuDNN by default), train and test
    assert metrics["firing_rate_per_layer"] and 0.0 < metrics["firing_rate_mean"] < 1.0
    assert metrics["wall_time_s"] > 0 and metrics["cuda_graph"] is False
    assert Genotype.from_json(metrics["genotype"]) == Genotype.from_json(
        (smoke_search / "genotype.json").read_text())
    assert {"last.pt", "best.pt"} <= {path.name for path in (run_dir / "checkpoints").iterdir()}
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0})
    events.Reload()
    tags = events.Tags()
    assert {"train/loss", "test/acc", "sparse_conv/dense:requested"} <= set(tags["scalars"])
    assert {"genotype/normal", "genotype/reduce"} <= set(tags["images"])
    assert any(tag.startswith("firing_rate/cells.") for tag in tags["histograms"])


@pytest.mark.slow
def test_ctrl_c_then_resume_gives_the_uninterrupted_genotype(tmp_path: Path,
                                                            smoke_search: Path) -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole process group, DataLoader workers too."""
    run_dir = tmp_path / "interrupted"
    search = subprocess.Popen(
        [sys.executable, str(REPO / "search.py"), *SMOKE, "data.num_workers=2",
         f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    assert search.stdout is not None
    for line in search.stdout:  # stop it inside cycle 0's re-stabilization, after the growth
        if "cycle 0: genotype" in line:
            break
    time.sleep(0.5)
    os.killpg(search.pid, signal.SIGINT)
    _, stderr = search.communicate(timeout=120)
    assert search.returncode == 128 + signal.SIGINT, stderr
    assert stderr.count("\n") == 1 and f"resume={run_dir}" in stderr
    assert not (run_dir / "genotype.json").exists()
    saved = load_checkpoint(run_dir / "checkpoints" / "last.pt", kind="search")["engine"]

    assert run_in_process("search", f"resume={run_dir}", cwd=tmp_path) == 0
    # It continued from the saved step with the saved α (what the GPU stop loop checks too).
    assert (f"resumed at global step {saved['global_step']}, α {alpha_digest(saved['supernet'])}"
            in (run_dir / "search.log").read_text())
    # The same batches with or without workers: the data order depends on (seed, epoch) only.
    assert (json.loads((run_dir / "genotype.json").read_text())
            == json.loads((smoke_search / "genotype.json").read_text()))
    log = (run_dir / "search.log").read_text()
    assert "resumed from" in log and log.count("SIGINT received") == 1  # workers stay quiet


def _torchrun_two_processes(script: str, *overrides: str, cwd: Path,
                            fresh: bool = True) -> subprocess.CompletedProcess[str]:
    new_run = [*SMOKE, "trainer=ddp"] if fresh else []  # a resume takes the saved config
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
         str(REPO / script), *new_run, *overrides],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_ddp_search_on_two_cpu_processes(tmp_path: Path) -> None:
    run_dir = tmp_path / "ddp"
    result = _torchrun_two_processes("search.py", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    Genotype.from_json((run_dir / "genotype.json").read_text())
    assert "2 processes" in (run_dir / "search.log").read_text()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ddp"]  # rank 1 wrote nothing
    assert (result.stdout + result.stderr).count("search halves") == 1  # and logged nothing: rank 0's line


@pytest.mark.slow
def test_ddp_retrain_on_two_cpu_processes(tmp_path: Path) -> None:
    run_dir = tmp_path / "ddp"
    result = _torchrun_two_processes("train.py", "genotype=DARTS_V2", f"hydra.run.dir={run_dir}",
                                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and 0.0 <= metrics["test_acc"] <= 1.0 and "pending" not in metrics
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert metrics["global_batch_size"] == 2 * config["batch_size"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ddp"]
    # Resumed under torchrun from another directory: every rank finds the checkpoint in the run dir.
    resumed = _torchrun_two_processes("train.py", f"resume={run_dir}", cwd=tmp_path, fresh=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in (run_dir / "train.log").read_text()


@pytest.mark.slow
def test_ddp_fine_tune_of_the_snn_on_two_cpu_processes(tmp_path: Path) -> None:
    """snn_finetune under torchrun: both ranks fine-tune the QANN's SNN at T (gradients all-reduced), evaluate their
    shards of the test set together, and rank 0 alone writes."""
    run_dir = tmp_path / "ddp"
    result = _torchrun_two_processes("train.py", "genotype=DARTS_V2", "epochs=1", "neuron=st_bif_qann",
                                     "neuron.level=4", "snn_max_timesteps=4", "snn_finetune.epochs=1",
                                     "snn_finetune.timesteps=2", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and "pending" not in metrics
    finetuned = metrics["snn_finetune"]
    assert finetuned["timesteps"] == 2 and set(finetuned["acc_at_t"]) == {"1", "2", "4", "6", "8", "16"}
    assert finetuned["history"][0]["epoch"] == 0 and finetuned["energy_per_image_uj"] > 0
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt", kind="train")
    assert state["snn_trainer"]["epoch"] == 1 and state["world_size"] == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ddp"]


@pytest.mark.slow
def test_a_qann_search_and_retrain_report_the_exact_snn(tmp_path: Path) -> None:
    """neuron=st_bif_qann: the search runs the QANN supernet; the retrain of its genotype reports the
    SNN built from the trained QANN, whose summed logits equal the QANN's (fp32 rounding)."""
    assert run_in_process("search", *SMOKE, "neuron=st_bif_qann", f"hydra.run.dir={tmp_path / 's'}", cwd=tmp_path) == 0
    assert run_in_process("train", *SMOKE, "neuron=st_bif_qann", f"genotype={tmp_path / 's' / 'genotype.json'}",
                          f"hydra.run.dir={tmp_path / 't'}", cwd=tmp_path) == 0
    metrics = json.loads((tmp_path / "t" / "metrics.json").read_text())
    assert metrics["snn_silent"] and metrics["snn_timesteps"] >= 1
    assert metrics["snn_test_acc"] == metrics["test_acc"] and metrics["snn_prediction_agreement"] == 1.0
    assert metrics["snn_logit_max_abs_diff"] < 1e-3
    assert set(metrics["snn_acc_at_t"]) >= {"1"}
    # The energy of the SNN: its first-layer conv reads the image (MACs), the rest reads spikes (SOPs).
    assert metrics["sops_per_image"] > 0 and metrics["macs_per_image"] > 0
    assert metrics["energy_per_image_uj"] == pytest.approx(
        (0.9 * metrics["sops_per_image"] + 4.6 * metrics["macs_per_image"]) * 1e-6)
    events = EventAccumulator(str(tmp_path / "t" / "tb")).Reload()
    assert "snn/accuracy_vs_timesteps" in events.Tags()["images"]
    assert events.Scalars("snn/test_acc")[-1].value == pytest.approx(metrics["snn_test_acc"])


@pytest.mark.parametrize("enabled", [False, True])
def test_trainer_cudnn_benchmark_sets_cudnns_autotuner(tmp_path: Path, enabled: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not enabled)
    overrides = (*SMOKE, "logger=none", "genotype=DARTS_V2", f"trainer.cudnn_benchmark={enabled}")
    assert run_in_process("train", *overrides, cwd=tmp_path) == 0
    assert torch.backends.cudnn.benchmark is enabled
