"""The SNN evaluation speed case (benchmarks/speed_snn_eval.py) on a CPU: both of train.py's evaluations timed on
random images and on a CIFAR-10 folder, read at every T up to the cap, and bad input as one line."""
from __future__ import annotations

import argparse

import pytest
import torch
from PIL import Image

from benchmarks import speed, speed_snn_eval

CLASSES = [f"class{index}" for index in range(10)]


@pytest.fixture(scope="module")
def cifar_folder(tmp_path_factory):
    """CIFAR-10 as an image-folder tree: two 32×32 images per class and split."""
    root = tmp_path_factory.mktemp("cifar10")
    generator = torch.Generator().manual_seed(0)
    for split in ("train", "test"):
        for name in CLASSES:
            (root / split / name).mkdir(parents=True)
            for index in range(2):
                pixels = torch.randint(256, (32, 32, 3), generator=generator, dtype=torch.uint8).numpy()
                Image.fromarray(pixels).save(root / split / name / f"{index}.png")
    return root


def test_the_smoke_run_times_both_evaluations_and_writes_no_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(speed, "RESULTS", tmp_path)
    assert speed.main(["--case", "snn_eval", "--tiny"]) == 0
    out = capsys.readouterr().out
    assert "24 random images in batches of 8 (loaded in " in out and "s), T = 1 … 16" in out
    assert "(converted: built and warmed up on one batch in " in out  # where a stopped case's time went
    assert "| DARTS_V2_SPIKE_NATIVE | converted |" in out and "| DARTS_V2_SPIKE_NATIVE | finetuned |" in out
    assert "| floor (s) | share of HBM |" in out
    assert ("snn_eval | DARTS_V2_SPIKE_NATIVE 3×4 level-4 binary SNN, finetuned (accuracy_against_timesteps), "
            "accuracy at T = 1 … 16 on 24 images: wall |") in out
    assert not list(tmp_path.iterdir())


def test_each_function_reads_the_accuracy_train_py_reports(cifar_folder):
    args = argparse.Namespace(data=str(cifar_folder), images=10_000, batch=8, workers=0, level=4, channels=4,
                              layers=3)
    batches, name = speed_snn_eval.test_batches(args)
    assert name == "CIFAR-10 test images" and [len(labels) for _, labels in batches] == [8, 8, 4]
    qann = speed_snn_eval.random_qann("DARTS_V2", args, batches, torch.device("cpu"))
    assert not qann.training
    converted = speed_snn_eval.run_function("converted", qann, batches, torch.device("cpu"), 8)
    # train.py's reported steps up to the cap, from one run at T = 8 (and beyond it, if that run fell silent)
    assert [steps for steps in converted if steps <= 8] == [1, 2, 4, 6, 8]
    snn = speed_snn_eval.evaluated_network("finetuned", qann)
    finetuned = speed_snn_eval.run_function("finetuned", snn, batches, torch.device("cpu"), 8)
    assert list(finetuned) == list(range(1, 9))
    assert converted[8] == finetuned[8]  # before fine-tuning, the trainable SNN is the converted one


def test_bad_input_is_one_line(tmp_path, capsys):
    assert speed.main(["--case", "snn_eval", "--rows-out", ""]) == 2  # no GPU here and no --tiny
    assert "pass --tiny (a CPU smoke run)" in capsys.readouterr().err
    assert speed.main(["--case", "snn_eval", "--tiny", "--max-timesteps", "0", "--rows-out", ""]) == 2
    assert capsys.readouterr().err.strip() == "speed.py --case snn_eval: --max-timesteps 0: pass a positive integer"
    assert speed.main(["--case", "snn_eval", "--tiny", "--data", str(tmp_path / "nowhere"), "--rows-out", ""]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("speed.py --case snn_eval: ") and "\n" not in error


def test_a_stopped_case_keeps_the_functions_it_timed(monkeypatch, capsys):
    timed = speed_snn_eval.time_function

    def stop_at_the_second(function, *rest):
        if function == "finetuned":
            raise KeyboardInterrupt
        return timed(function, *rest)

    monkeypatch.setattr(speed_snn_eval, "time_function", stop_at_the_second)
    rows = speed_snn_eval.main(["--tiny"])
    assert [row.metric.split(", ")[1].split(" ")[0] for row in rows] == ["converted"]
    assert "stopped after 1 rows: keeping them" in capsys.readouterr().err


def test_the_floor_counts_the_qann_pass_of_the_converted_function_and_scales_with_the_images():
    args = argparse.Namespace(data=None, images=8, batch=4, workers=0, level=4, channels=4, layers=3)
    batches, _ = speed_snn_eval.test_batches(args)
    qann = speed_snn_eval.random_qann("DARTS_V2", args, batches, torch.device("cpu"))
    image = batches[0][0][:2]
    snn_only = speed_snn_eval.least_bytes("finetuned", qann, image, 100, 8)
    with_qann = speed_snn_eval.least_bytes("converted", qann, image, 100, 8)
    assert 0 < snn_only < with_qann < 2 * snn_only  # one QANN forward costs less than T = 8 SNN steps
    assert speed_snn_eval.least_bytes("finetuned", qann, image, 200, 8) == 2 * snn_only
    assert speed_snn_eval.least_bytes("finetuned", qann, image, 100, 16) > 1.8 * snn_only  # the SNN's bytes grow with T
