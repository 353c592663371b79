"""Every bad input gives one stderr line naming the problem and the fix, a non-zero exit, no
traceback, and loses nothing already written.

The entry points run in this process (conftest.run_app) so that each case costs a fraction of
a second; the subprocess tests in test_entry_points.py show the same guard in real processes.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from aso_se.run import errors
from aso_se.run.checkpoint import load_checkpoint, save_checkpoint
from tests.aso_se.run.helpers import SMOKE, RunApp, nan_from_call


def assert_one_line(stderr: str, *fragments: str) -> None:
    assert stderr.startswith("error: ") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in stderr


@pytest.fixture
def damaged_copy(finished_search: Path, tmp_path: Path) -> Path:
    """A copy of the session's finished smoke search (conftest.py), for the tests that damage it."""
    return Path(shutil.copytree(finished_search, tmp_path / "copy"))


@pytest.mark.parametrize(("override", "fragments"), [
    ("no_such_key=1", ["Could not override 'no_such_key'", "+no_such_key=1"]),
    ("data=nope", ["Could not find 'data/nope'", "mnist5k"]),
    ("search.schedule.cycles=0", ["cycles=0", "fix search.schedule"]),
    ("trainer.precision=fp16", ["trainer.precision=fp16", "fp32 or bf16"]),
    ("trainer=ddp", ["torchrun --nproc_per_node"]),
    ("resume=no/such/dir", ["resume dir no/such/dir does not exist"]),
    ("optim=retrain", ["Could not override 'optim'", "search_optim=adam|darts"]),  # train.py's group
    ("model=small", ["model= chooses train.py's network", "search.supernet.channels"]),  # likewise
])
def test_bad_search_override(override: str, fragments: list[str], run_app: RunApp,
                             tmp_path: Path) -> None:
    code, stderr = run_app("search", *SMOKE, override)
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, *fragments)
    assert not (tmp_path / "no").exists()  # a mistyped resume dir is never created


@pytest.mark.parametrize(("overrides", "fragments"), [
    (["derive=beam"], ["derive=beam", "pass derive=alpha", "or derive=strength"]),
    (["derive=strength", "derive_images=0"], ["derive_images=0", "1 or more images", "null for all"]),
    (["derive=strength", "search_space.primitives=[skip_connect,sep_conv_3x3]"], ["lacks", "add none"]),
])
def test_a_final_derivation_it_cannot_apply_stops_the_search_before_it_starts(
        overrides: list[str], fragments: list[str], run_app: RunApp, tmp_path: Path) -> None:
    code, stderr = run_app("search", *SMOKE, *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, *fragments)
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before the first epoch


def test_bad_logger_setting(run_app: RunApp) -> None:
    code, stderr = run_app("search", *SMOKE, "logger=tensorboard", "logger.alpha_figure_every_n_epochs=0")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "alpha_figure_every_n_epochs=0", "an int >= 1")


@pytest.mark.parametrize(("text", "fragments"), [
    ("{not json", ["genotype.json", "must be JSON"]),
    ('{"normal": [["conv_9x9", 0], ["skip_connect", 1]], "normal_concat": [2],'
     ' "reduce": [["skip_connect", 0], ["skip_connect", 1]], "reduce_concat": [2]}',
     ["unknown op 'conv_9x9'", "sep_conv_3x3"]),
])
def test_bad_genotype_file(text: str, fragments: list[str], run_app: RunApp,
                           tmp_path: Path) -> None:
    (tmp_path / "genotype.json").write_text(text)
    code, stderr = run_app("train", *SMOKE, "genotype=genotype.json")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, *fragments)
    assert (tmp_path / "genotype.json").read_text() == text


def test_search_optimizer_given_to_train(run_app: RunApp) -> None:
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "search_optim=darts")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "Could not override 'search_optim'", "optim=retrain")


@pytest.mark.parametrize(("override", "fragments"), [
    ("snn_spikes_per_step=0", ["snn_spikes_per_step=0", "positive integer"]),
    ("snn_first_timesteps=0", ["snn_first_timesteps=0", "null", "positive integer"]),
    pytest.param("snn_eval_dtype=float16", ["snn_eval_dtype='float16'", "float32", "float64"], marks=pytest.mark.slow),
    ("snn_finetune.timesteps=0", ["snn_finetune.timesteps=0", "positive integer"]),
    ("snn_finetune.surrogate=tanh", ["snn_finetune.surrogate='tanh'", "sigmoid, atan or rectangular"]),
    ("neuron=relu snn_finetune.epochs=1", ["snn_finetune.epochs=1", "neuron=st_bif_qann", "snn_finetune.epochs=0"]),
])
def test_bad_snn_setting_stops_the_retrain_before_it_trains(override: str, fragments: list[str], run_app: RunApp,
                                                           tmp_path: Path) -> None:
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "neuron=st_bif_qann", *override.split(),
                           "hydra.run.dir=run")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, *fragments)
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before the first epoch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the error is for runs without a GPU")
def test_cuda_graph_without_a_gpu(run_app: RunApp, tmp_path: Path) -> None:
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "cuda_graph=true")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "cuda_graph=true needs a CUDA device", "cuda_graph=false")


def test_no_genotype_and_no_search_yet(run_app: RunApp) -> None:
    code, stderr = run_app("train", *SMOKE)
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "run python search.py first", "genotype=")


def test_resume_dir_without_checkpoint(run_app: RunApp, tmp_path: Path) -> None:
    (tmp_path / "empty_run").mkdir()
    code, stderr = run_app("search", "resume=empty_run")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "has no checkpoints/last.pt")
    assert list((tmp_path / "empty_run").iterdir()) == []


def test_resume_corrupt_checkpoint_keeps_the_run(damaged_copy: Path, run_app: RunApp) -> None:
    """No checkpoint before it to fall back to (test_retrain_resume.py has the fallback): one line, nothing touched."""
    last = damaged_copy / "checkpoints" / "last.pt"
    for kept in damaged_copy.glob("checkpoints/last.*.pt"):
        kept.unlink()
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    before = {path: path.read_bytes() for path in damaged_copy.rglob("*") if path.is_file()}
    code, stderr = run_app("search", f"resume={damaged_copy}")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "unreadable", str(last))
    for path, content in before.items():
        assert path.read_bytes() == content


def test_resume_with_the_other_entry_point(damaged_copy: Path, run_app: RunApp) -> None:
    code, stderr = run_app("train", f"resume={damaged_copy}")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "written by the search entry point", "search.py")


def test_resume_checkpoint_that_does_not_fit(damaged_copy: Path, run_app: RunApp) -> None:
    last = damaged_copy / "checkpoints" / "last.pt"
    state = load_checkpoint(last, kind="search")
    name = next(iter(state["engine"]["supernet"]))
    state["engine"]["supernet"][name] = torch.zeros(3, 3, 3)  # a weight of another shape
    save_checkpoint(state, last, kind="search")
    code, stderr = run_app("search", f"resume={damaged_copy}")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "does not fit", name)


def test_resume_with_other_overrides(damaged_copy: Path, run_app: RunApp) -> None:
    code, stderr = run_app("search", f"resume={damaged_copy}", "batch_size=8")
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "drop the overrides batch_size=8")


def test_resume_with_a_data_setting_the_run_does_not_have(damaged_copy: Path, run_app: RunApp) -> None:
    code, stderr = run_app("search", f"resume={damaged_copy}", "+data.root=/elsewhere")  # mnist5k has no root
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "+data.root=/elsewhere: this run's data has no root setting")



@pytest.mark.slow  # CI keeps the engine's NaN test, the retrain's app-level one and the overflowed-weights search
def test_nan_loss_stops_the_search_and_keeps_the_last_checkpoint(
        run_app: RunApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Epoch 1 (search) is 2 steps of 2 losses (α, weights); epoch 2 (re-stabilization) has one
    # loss per step: its second step diverges.
    nan_from_call(6, monkeypatch)
    code, stderr = run_app("search", *SMOKE, "hydra.run.dir=run")
    assert code == errors.EXIT_DIVERGED
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    assert_one_line(stderr, "loss is nan at cycle 0, restabilize epoch 1, step 1",
                    f"last good checkpoint kept: {last}")
    assert load_checkpoint(last, kind="search")["engine"]["global_step"] == 2


def test_nan_loss_stops_the_retrain(run_app: RunApp, monkeypatch: pytest.MonkeyPatch) -> None:
    nan_from_call(2, monkeypatch)
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "hydra.run.dir=run")
    assert code == errors.EXIT_DIVERGED
    assert_one_line(stderr, "NaN/Inf at epoch 1, step 2", "no checkpoint was saved yet")


def test_weights_that_overflowed_behind_a_finite_loss_are_never_saved(run_app: RunApp, tmp_path: Path) -> None:
    """lr 1e37: the last warm-up step's loss is finite but its update leaves Inf weights, which the
    epoch's checkpoint would have saved as the 'last good' one."""
    code, stderr = run_app("search", *SMOKE, "search.schedule.warmup_epochs=1", "optim.weights.lr=1e37",
                           "hydra.run.dir=run")
    assert code == errors.EXIT_DIVERGED
    assert_one_line(stderr, "became NaN/Inf by global step", "no checkpoint was saved yet")
    assert not (tmp_path / "run" / "checkpoints" / "last.pt").exists()


def test_out_of_memory_names_the_knobs(run_app: RunApp, monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr("aso_se.search.step.SearchStep.weight_step", out_of_memory)
    code, stderr = run_app("search", *SMOKE, "hydra.run.dir=run")
    assert code == errors.EXIT_OUT_OF_MEMORY
    assert_one_line(stderr, "out of GPU memory", "batch_size", "search.supernet.channels")


def test_resume_of_a_search_with_a_train_evaluation_knob(damaged_copy: Path, run_app: RunApp) -> None:
    code, stderr = run_app("search", f"resume={damaged_copy}", "+snn_max_timesteps=16")  # + past Hydra's check
    assert code == errors.EXIT_BAD_INPUT
    assert_one_line(stderr, "+snn_max_timesteps=16: this run's config has no snn_max_timesteps setting")
