"""Atomic checkpoint files: round trip, every unusable-file case, and SIGKILL mid-write."""
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from aso_se.run.checkpoint import (
    CheckpointError,
    UnreadableCheckpoint,
    history,
    load_checkpoint,
    load_newest_readable,
    older,
    restore_errors,
    save_checkpoint,
)
from search_space.errors import UserInputError


def test_round_trip_keeps_tensors_and_containers(tmp_path: Path) -> None:
    state = {"model": nn.Linear(3, 5).state_dict(), "epoch": 7, "history": [{"acc": 0.5}],
             "rng": torch.get_rng_state()}
    save_checkpoint(state, tmp_path / "checkpoints" / "last.pt", kind="train")
    loaded = load_checkpoint(tmp_path / "checkpoints" / "last.pt", kind="train")
    assert loaded.keys() == state.keys()
    assert torch.equal(loaded["model"]["weight"], state["model"]["weight"])
    assert loaded["epoch"] == 7 and loaded["history"] == [{"acc": 0.5}]
    assert torch.equal(loaded["rng"], state["rng"])
    assert not list((tmp_path / "checkpoints").glob(".*tmp"))  # the temporary file was renamed


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist") as err:
        load_checkpoint(tmp_path / "last.pt", kind="search")
    assert isinstance(err.value, UserInputError) and "\n" not in str(err.value)


def test_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint({"w": torch.randn(1000)}, path, kind="search")
    path.write_bytes(path.read_bytes()[:1500])
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path, kind="search")


def test_not_a_checkpoint_of_ours(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"weight": torch.randn(3)}, path)
    with pytest.raises(CheckpointError, match="not an ASO-SE checkpoint"):
        load_checkpoint(path, kind="train")


def test_other_entry_points_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1}, path, kind="train")
    with pytest.raises(CheckpointError, match="written by the train entry point"):
        load_checkpoint(path, kind="search")


def test_other_format_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "last.pt"
    monkeypatch.setattr("aso_se.run.checkpoint.FORMAT_VERSION", 0)
    save_checkpoint({"epoch": 1}, path, kind="train")
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match="format version 0"):
        load_checkpoint(path, kind="train")


def test_state_that_does_not_fit(tmp_path: Path) -> None:
    state = nn.Linear(3, 5).state_dict()
    with pytest.raises(CheckpointError, match="does not fit"):
        with restore_errors(tmp_path / "last.pt"):
            nn.Linear(4, 5).load_state_dict(state)


_WRITER = textwrap.dedent("""
    import sys, torch
    from aso_se.run.checkpoint import save_checkpoint
    path = sys.argv[1]
    for version in range(1_000_000):
        save_checkpoint({"version": version, "w": torch.full((1_500_000,), float(version))},
                        path, kind="search")
        print(version, flush=True)
""")


def test_sigkill_mid_write_never_corrupts(tmp_path: Path) -> None:
    """A writer saving 6 MB checkpoints in a loop is SIGKILLed at several moments."""
    path = tmp_path / "last.pt"
    for delay in (0.0, 0.021):
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)],
                                  stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None
        writer.stdout.readline()  # one save has finished: a checkpoint exists
        time.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        loaded = load_checkpoint(path, kind="search")
        assert torch.equal(loaded["w"], torch.full((1_500_000,), float(loaded["version"])))


def test_saves_keep_the_configured_history_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "checkpoints" / "last.pt"
    for value in range(4):
        save_checkpoint({"value": value}, path, kind="train", keep=3)
    assert history(path) == [path, older(path, 1), older(path, 2)]
    assert [load_checkpoint(p, kind="train")["value"] for p in history(path)] == [3, 2, 1]
    save_checkpoint({"value": 4}, path, kind="train", keep=1)  # keep=1: the history is left as it is
    assert [load_checkpoint(p, kind="train")["value"] for p in history(path)] == [4, 2, 1]


def test_a_truncated_newest_checkpoint_falls_back_to_the_one_before(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    for value in range(3):
        save_checkpoint({"value": value}, path, kind="train", keep=3)
    path.write_bytes(path.read_bytes()[:100])
    warnings: list[str] = []
    state, loaded = load_newest_readable(path, kind="train", warn=warnings.append)
    assert (state["value"], loaded) == (1, older(path, 1))
    (line,) = warnings
    assert str(path) in line and "unreadable" in line and str(older(path, 1)) in line
    assert (tmp_path / "last.pt.corrupt").is_file() and not path.exists()  # set aside, out of the history


def test_every_kept_checkpoint_damaged_is_one_error_naming_the_oldest(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    for value in range(2):
        save_checkpoint({"value": value}, path, kind="train", keep=2)
    for damaged in history(path):
        damaged.write_bytes(b"\x00" * 64)
    with pytest.raises(UnreadableCheckpoint, match=f"checkpoint {older(path, 1)} is unreadable"):
        load_newest_readable(path, kind="train", warn=lambda line: None)
