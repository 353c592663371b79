"""benchmarks/ranking_over_epochs.py: τ between each epoch's accuracy and the last epoch's, from TensorBoard files."""
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from benchmarks import ranking_over_epochs


def write_piece(run: Path, start_time: int, values: dict[int, float], losses: dict[int, float] | None = None) -> None:
    """One train.py piece's TensorBoard file of `test/acc` per step and `train/loss` (1 - acc unless `losses` gives
    only it), named as if it started at `start_time`."""
    piece = run / "tb" / f"piece_{start_time}"
    with SummaryWriter(str(piece)) as writer:
        for step, value in values.items():
            writer.add_scalar("test/acc", value, step)
            writer.add_scalar("train/loss", 1.0 - value, step)
        for step, loss in (losses or {}).items():
            writer.add_scalar("train/loss", loss, step)
    (written,) = piece.glob("events.out.tfevents.*")
    parts = written.name.split(".")
    parts[3] = str(start_time)
    written.rename(run / "tb" / ".".join(parts))
    piece.rmdir()


@pytest.fixture
def runs(tmp_path):
    """Three cells of 6 epochs: the early leader ends last and the early last ends first (a crossing)."""
    curves = {"fast": [0.5, 0.6, 0.7, 0.72, 0.73, 0.74], "middle": [0.4, 0.55, 0.66, 0.74, 0.76, 0.78],
              "slow": [0.3, 0.5, 0.6, 0.75, 0.8, 0.82]}
    paths = []
    for name, curve in curves.items():
        run = tmp_path / name
        # two pieces, the second resumed at epoch 3 and logging it again with another value: the later one counts
        write_piece(run, 1000, {10 * (e + 1): acc for e, acc in enumerate(curve[:3])} | {30: 0.0})
        write_piece(run, 2000, {10 * (e + 1): acc for e, acc in enumerate(curve) if e >= 2})
        paths.append(run)
    return paths, curves


def test_read_curve_keeps_the_later_piece_of_a_step_logged_twice(runs):
    paths, curves = runs
    assert ranking_over_epochs.read_curve(paths[0]) == pytest.approx(curves["fast"])


def test_tau_turns_from_reversed_to_agreeing(runs, capsys):
    paths, _ = runs
    assert ranking_over_epochs.main(["--runs", *map(str, paths), "--epochs", "1,3,6", "--window", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| epoch | τ-b vs epoch 6 | fast | middle | slow |")
    assert lines[2] == "| 1 | -1.00 | 50.0 | 40.0 | 30.0 |"
    assert lines[3] == "| 3 | -1.00 | 70.0 | 66.0 | 60.0 |"
    assert lines[4] == "| 6 | 1.00 | 74.0 | 78.0 | 82.0 |"


def test_window_averages_the_epochs_ending_at_each(runs):
    paths, _ = runs
    curves = {path.name: ranking_over_epochs.read_curve(path) for path in paths}
    tau, means = ranking_over_epochs.tau_at(curves, 4, window=2)
    assert means == pytest.approx([0.71, 0.70, 0.675])
    assert tau == pytest.approx(-1.0)


@pytest.mark.parametrize("args, message", [
    (["--epochs", "1,7"], "--epochs [7] lie outside the runs' epochs"),
    (["--epochs", "1,x"], "pass comma-separated epochs"),
    (["--epochs", "1", "--window", "0"], "--window 0: pass 1 or more epochs"),
])
def test_bad_arguments_exit_2_with_one_line(runs, capsys, args, message):
    paths, _ = runs
    assert ranking_over_epochs.main(["--runs", *map(str, paths), *args]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1


def test_runs_without_curves_or_of_other_lengths_are_refused(runs, tmp_path, capsys):
    paths, _ = runs
    empty = tmp_path / "empty"
    (empty / "tb").mkdir(parents=True)
    assert ranking_over_epochs.main(["--runs", str(paths[0]), str(empty), "--epochs", "1"]) == 2
    assert "no test/acc scalars" in capsys.readouterr().err
    short = tmp_path / "short"
    write_piece(short, 1000, {10: 0.1, 20: 0.2})
    assert ranking_over_epochs.main(["--runs", str(paths[0]), str(short), "--epochs", "1"]) == 2
    assert "logged [2, 6] epochs" in capsys.readouterr().err


def test_runs_of_one_name_in_two_benchmark_dirs_both_count(runs, tmp_path, capsys):
    """A capped protocol's retrain/search_0_seed0 beside the uncapped one: two columns, neither hiding the other."""
    paths, curves = runs
    twins = []
    for protocol, curve in (("uncapped", curves["fast"]), ("capped", curves["slow"])):
        run = tmp_path / protocol / "retrain" / "search_0_seed0"
        write_piece(run, 1000, {10 * (e + 1): acc for e, acc in enumerate(curve)})
        twins.append(run)
    assert ranking_over_epochs.main(["--runs", str(paths[1]), *map(str, twins), "--epochs", "6", "--window", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("| middle | uncapped:search_0_seed0 | capped:search_0_seed0 |")
    assert lines[2] == "| 6 | 1.00 | 78.0 | 74.0 | 82.0 |"
    assert ranking_over_epochs.main(["--runs", str(twins[0]), str(twins[0]), "--epochs", "6"]) == 2
    assert "a run dir is passed twice" in capsys.readouterr().err


def test_another_curve_ranks_against_the_last_test_accuracy_and_a_loss_low_is_better(runs, capsys):
    paths, _ = runs
    assert ranking_over_epochs.main(["--runs", *map(str, paths), "--epochs", "1,6", "--window", "1",
                                     "--tag", "train/loss"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| epoch | τ-b of train/loss vs epoch 6's test/acc | fast | middle | slow |")
    assert lines[2] == "| 1 | -1.00 | 0.500 | 0.600 | 0.700 |"  # the loss is 1 - acc: the same ranks as the acc
    assert lines[3] == "| 6 | 1.00 | 0.260 | 0.220 | 0.180 |"


def test_an_unfinished_run_is_placed_among_the_finished_at_its_last_epoch(runs, tmp_path, capsys):
    paths, _ = runs
    running = tmp_path / "running"
    write_piece(running, 1000, {10: 0.2, 20: 0.3, 30: 0.68})  # 3 of 6 epochs: between fast (0.70) and middle (0.66)
    assert ranking_over_epochs.main(["--runs", *map(str, paths), "--epochs", "6", "--window", "1",
                                     "--tag", "train/loss", "--unfinished", str(running)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[4].startswith("| unfinished run | epoch | test acc | place at that epoch among it and 3 finished")
    assert lines[4].endswith("| train/loss | place by train/loss |")
    # the finished gained 74 - 70, 78 - 66 and 82 - 60 points from epoch 3 to 6: mean 12.67, std 9.02; its loss 0.32
    # lies between fast's 0.30 and middle's 0.34: second lowest, so second by train/loss as by test acc
    assert lines[6] == "| running | 3 | 68.0 | 2 of 4 | +12.67 ± 9.02 (+4.00 to +22.00) | 0.320 | 2 of 4 |"


def test_an_unfinished_run_is_placed_by_another_curve_where_it_disagrees_with_the_test_accuracy(runs, tmp_path,
                                                                                                capsys):
    paths, _ = runs
    running = tmp_path / "running"
    write_piece(running, 1000, {10: 0.2, 20: 0.3, 30: 0.68})
    # its training loss at epoch 3 beats every finished run's (their 0.30, 0.34, 0.40), unlike its test accuracy
    write_piece(running, 3000, {}, losses={30: 0.1})
    assert ranking_over_epochs.main(["--runs", *map(str, paths), "--epochs", "6", "--window", "1",
                                     "--tag", "train/loss", "--unfinished", str(running)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[6] == "| running | 3 | 68.0 | 2 of 4 | +12.67 ± 9.02 (+4.00 to +22.00) | 0.100 | 1 of 4 |"


def test_an_unfinished_run_ranked_by_test_accuracy_gets_no_second_place(runs, tmp_path, capsys):
    paths, _ = runs
    running = tmp_path / "running"
    write_piece(running, 1000, {10: 0.2, 20: 0.3, 30: 0.68})
    assert ranking_over_epochs.main(["--runs", *map(str, paths), "--epochs", "6", "--window", "1",
                                     "--unfinished", str(running)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[4].endswith("(min to max) |")
    assert lines[6] == "| running | 3 | 68.0 | 2 of 4 | +12.67 ± 9.02 (+4.00 to +22.00) |"


def test_an_unfinished_run_that_logged_every_epoch_is_refused(runs, capsys):
    paths, _ = runs
    assert ranking_over_epochs.main(["--runs", *map(str, paths[:2]), "--epochs", "6",
                                     "--unfinished", str(paths[2])]) == 2
    assert "--unfinished ['slow'] logged 6 epochs or more; pass finished runs in --runs" in capsys.readouterr().err
