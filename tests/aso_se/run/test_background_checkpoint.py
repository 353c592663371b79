"""Epoch-end checkpoints written on a background thread: the file holds the state as it was when saved, writes
land in order, and a failed write is raised by the next save with the previous file intact."""
from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
import torch

from aso_se.run import checkpoint
from aso_se.run.atomic_write import CheckpointWriteError
from aso_se.run.checkpoint import CheckpointWriter, history, load_checkpoint


@pytest.fixture
def held_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """torch.save of a checkpoint waits until the returned event is set: the test decides when a write happens."""
    release, real_save = threading.Event(), torch.save

    def save(obj, f, *args, **kwargs):
        assert release.wait(30), "the test never released the write"
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    return release


def _state(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {"model": {"weight": torch.randn(5, 3, generator=generator),
                      "strided": torch.randn(6, 4, generator=generator)[::2]},  # not dense: packed apart
            "step": torch.tensor(seed), "epoch": seed}


def test_a_background_save_keeps_the_state_as_it_was_while_training_changes_it(
        tmp_path: Path, held_writes: threading.Event) -> None:
    path, writer, state = tmp_path / "last.pt", CheckpointWriter(), _state(1)
    saved = {"weight": state["model"]["weight"].clone(), "strided": state["model"]["strided"].clone()}
    writer.save(state, path, kind="search", background=True)
    assert not path.exists()  # returned before the write
    for tensor in (state["model"]["weight"], state["model"]["strided"], state["step"]):
        tensor.add_(100)  # the next training step, before the file is written
    held_writes.set()
    writer.wait()
    loaded = load_checkpoint(path, kind="search")
    assert torch.equal(loaded["model"]["weight"], saved["weight"])
    assert torch.equal(loaded["model"]["strided"], saved["strided"])
    assert loaded["model"]["strided"].stride() == (8, 1)  # its layout kept
    assert int(loaded["step"]) == 1 and loaded["epoch"] == 1


def test_background_writes_land_in_the_order_saved(tmp_path: Path, held_writes: threading.Event) -> None:
    path, writer = tmp_path / "last.pt", CheckpointWriter()
    for epoch in (1, 2, 3):  # the third waits for the first: at most two pending
        if epoch == 3:
            held_writes.set()
        writer.save(_state(epoch), path, kind="search", keep=3, background=True)
    writer.wait()
    assert [load_checkpoint(p, kind="search")["epoch"] for p in history(path)] == [3, 2, 1]


def test_a_synchronous_save_waits_for_the_background_one(tmp_path: Path) -> None:
    path, writer = tmp_path / "last.pt", CheckpointWriter()
    writer.save(_state(1), path, kind="search", background=True)
    writer.save(_state(2), path, kind="search")  # e.g. the final save at a stop
    assert load_checkpoint(path, kind="search")["epoch"] == 2


def test_a_failed_background_write_is_raised_by_the_next_save(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path, writer = tmp_path / "last.pt", CheckpointWriter()
    writer.save(_state(1), path, kind="search")
    real_replace, failed = os.replace, threading.Event()

    def replace(src, dst):
        failed.set()
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(checkpoint.os, "replace", replace)
    writer.save(_state(2), path, kind="search", background=True)  # fails on its thread
    assert failed.wait(30)
    for thread in threading.enumerate():  # its thread records the error as it ends
        if thread.name == "checkpoint-writer":
            thread.join(30)
    monkeypatch.setattr(checkpoint.os, "replace", real_replace)
    with pytest.raises(CheckpointWriteError, match=r"\[Errno 30\] Read-only file system; free space or make"):
        writer.save(_state(3), path, kind="search", background=True)
    writer.wait()  # the error was raised once; the failed save did not start another write
    assert load_checkpoint(path, kind="search")["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary file left


def test_wait_with_a_timeout_returns_while_the_write_is_held(tmp_path: Path, held_writes: threading.Event) -> None:
    path, writer = tmp_path / "last.pt", CheckpointWriter()
    writer.save(_state(1), path, kind="search", background=True)
    writer.wait(timeout_s=0.05)
    assert not path.exists()
    held_writes.set()
    writer.wait()
    assert load_checkpoint(path, kind="search")["epoch"] == 1
