"""benchmarks/common.py: what the benchmarks share (statistics, override quoting, reading runs back).

The multiruns and the override checks run end to end in each benchmark's own tests."""
from __future__ import annotations

import argparse

import pytest

from benchmarks import common as bench
from search_space.errors import UserInputError


def test_mean_std_is_the_sample_std():
    assert bench.mean_std([0.5, 0.7, 0.9]) == (pytest.approx(0.7), pytest.approx(0.2))
    assert bench.mean_std([0.25]) == (0.25, None)
    with pytest.raises(ValueError):
        bench.mean_std([])


def test_user_input_errors_are_one_line():
    with pytest.raises(UserInputError, match="single quote"):
        bench.quoted("/tmp/it's")


def test_same_config_ignores_only_the_keys_it_is_told_to(tmp_path):
    def run_dir(name: str, seed: int, epochs: int) -> bench.Path:
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "config.yaml").write_text(f"seed: {seed}\nepochs: {epochs}\n"
                                                                 "data: {name: mnist5k}\n")
        return tmp_path / name

    same = [run_dir("a", 0, 5), run_dir("b", 1, 5)]
    assert bench.same_config(same, ignore=("seed",)) == {"epochs": 5, "data": {"name": "mnist5k"}}
    with pytest.raises(bench.BenchmarkError, match="runs a and b ran with different configs"):
        bench.same_config(same, ignore=())
    with pytest.raises(bench.BenchmarkError, match=r"runs a and c .*c/\.hydra/config\.yaml"):
        bench.same_config([*same, run_dir("c", 2, 6)], ignore=("seed",))


def test_same_config_compares_the_global_batch_not_how_many_processes_shared_it(tmp_path):
    def run_dir(name: str, batch: int, ddp: bool, metrics: dict | None) -> bench.Path:
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "config.yaml").write_text(
            f"seed: 0\nbatch_size: {batch}\ntrainer: {{ddp: {str(ddp).lower()}, precision: fp16}}\n")
        if metrics is not None:
            (tmp_path / name / "metrics.json").write_text(bench.json.dumps(metrics))
        return tmp_path / name

    one_gpu = run_dir("one", 1024, False, {"world_size": 1})
    two_gpus = run_dir("two", 512, True, {"world_size": 2})
    recorded = run_dir("recorded", 256, True, {"world_size": 2, "global_batch_size": 1024})  # resumed on fewer
    assert bench.same_config([one_gpu, two_gpus, recorded], ignore=()) == {
        "seed": 0, "batch_size": 1024, "trainer": {"precision": "fp16"}}
    with pytest.raises(bench.BenchmarkError, match="runs one and half"):
        bench.same_config([one_gpu, run_dir("half", 512, False, {"world_size": 1})], ignore=())


def test_a_train_run_with_evaluations_pending_is_finished_only_without_a_checkpoint_to_redo_them(tmp_path):
    """metrics.json with ``pending``: the machine was lost after training, during the SNN or energy evaluation."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert not bench.finished(run, "train.py")
    (run / "metrics.json").write_text('{"test_acc": 0.9, "pending": ["snn", "energy"]}')
    assert bench.finished(run, "train.py")  # no checkpoint: the training's figures stand
    (run / bench.CHECKPOINT).write_bytes(b"weights")
    assert not bench.finished(run, "train.py")  # --resume redoes the evaluations from it
    (run / "metrics.json").write_text('{"test_acc": 0.9}')
    assert bench.finished(run, "train.py")


def test_a_sweep_is_one_multirun_command_a_user_can_rerun(tmp_path):
    sweep = bench.Sweep(label="retrain", script="train.py", stage_dir=tmp_path / "re train", overrides=("epochs=1",),
                        key="genotype", values=("'/g/a.json'", "DARTS_V2"), names=("a", "DARTS_V2"),
                        subdir="${aso_se.stem:${genotype}}")
    assert sweep.command(bench.LAUNCHERS["local_gpus"], ["DARTS_V2"]) == [
        "python", "train.py", "-m", "+sweep=local_gpus", "epochs=1", "genotype=DARTS_V2",
        f"hydra.sweep.dir='{tmp_path / 're train'}'", "hydra.sweep.subdir='${aso_se.stem:${genotype}}'"]
    assert sweep.run_dirs() == [tmp_path / "re train" / "a", tmp_path / "re train" / "DARTS_V2"]


@pytest.mark.parametrize("override", ["hydra.sweep.dir=/x", "+sweep=local_gpus", "hydra.run.dir=/x"])
def test_the_multiruns_own_keys_are_refused(override):
    with pytest.raises(UserInputError, match="--launcher"):
        bench.check_overrides([override])
    assert bench.check_overrides(["sweep.jobs_per_gpu=2"]) == ("sweep.jobs_per_gpu=2",)


@pytest.mark.parametrize("script", ["search.py", "train.py"])
def test_a_resume_command_forces_the_machines_data_root_which_the_default_config_lacks(tmp_path, script):
    """A resume composes the entry point's default config (mnist5k: no data.root), so ``data.root=`` would be
    refused by Hydra before the run's own config is read; the resume command forces it (``++``)."""
    sweep = bench.Sweep(label="s", script=script, stage_dir=tmp_path, key="seed", values=("0",), names=("s0",),
                        overrides=("experiment=cifar10_qann", "data.root=/data/c10", "+data.num_workers=3",
                                   "sweep.jobs_per_gpu=2"), subdir="s${seed}")
    command = sweep.resume_command(bench.LAUNCHERS["local_gpus"], [tmp_path / "s0"])
    assert command[3:7] == ["+sweep=local_gpus", "++data.root=/data/c10", "++data.num_workers=3",
                            "sweep.jobs_per_gpu=2"]
    entry = script.removesuffix(".py")
    assert bench.compose_config(entry, command[4:6]).data.root == "/data/c10"
    with pytest.raises(UserInputError, match="data.root"):  # what the command passed before
        bench.compose_config(entry, ["data.root=/data/c10"])


def test_resume_continues_an_unfinished_run_from_its_checkpoint_through_the_launcher(tmp_path, capsys):
    """--resume: a run that saved a checkpoint but no result goes on from it (resume=, through the same launcher,
    with the overrides a resume takes); a finished one is left alone."""
    stage = tmp_path / "re train"
    sweep = bench.Sweep(label="retrain", script="train.py", stage_dir=stage,
                        overrides=("experiment=smoke", "logger=none", "epochs=1", "sweep.jobs_per_gpu=1"),
                        key="genotype", values=("DARTS_V2", "POOR_POOL_SKIP"), names=("DARTS_V2", "POOR_POOL_SKIP"),
                        subdir="${aso_se.stem:${genotype}}")
    darts, poor = sweep.run_dirs()
    assert bench.run_sweeps([sweep], "local_gpus", False, tmp_path / "logs") == [darts, poor]
    capsys.readouterr()
    finished_at = (poor / "metrics.json").stat().st_mtime_ns
    (darts / "metrics.json").unlink()  # stopped after its last checkpoint, before its result
    assert bench.run_sweeps([sweep], "local_gpus", True, tmp_path / "logs") == [darts, poor]
    (command,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert "+sweep=local_gpus" in command and "sweep.jobs_per_gpu=1" in command and "experiment=smoke" not in command
    assert f"resume='{darts}'" in command
    assert (darts / "metrics.json").is_file() and (poor / "metrics.json").stat().st_mtime_ns == finished_at
    assert "resumed from" in (darts / "train.log").read_text()
    # a run without a checkpoint is redone from scratch: test_search_vs_random's resume test (slow)


def test_run_into_out_refuses_a_used_out_and_reports_failures_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    calls = []

    def run(args):
        calls.append(args.out)
        return {"rows": 1}

    assert bench.run_into_out("tool", argparse.Namespace(out=out, resume=False), run) == (0, {"rows": 1})
    (out / "kept.json").parent.mkdir(parents=True)
    (out / "kept.json").write_text("{}")
    assert bench.run_into_out("tool", argparse.Namespace(out=out, resume=False), run) == (2, None)
    assert capsys.readouterr().err.strip().startswith("tool: --out") and calls == [out]
    assert (out / "kept.json").read_text() == "{}"  # nothing written is lost

    def fail(args):
        raise bench.BenchmarkError("search seed 0 failed; see its log")

    assert bench.run_into_out("tool", argparse.Namespace(out=out, resume=True), fail) == (1, None)
    assert capsys.readouterr().err.strip() == "tool: search seed 0 failed; see its log"
