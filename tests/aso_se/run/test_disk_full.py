"""A checkpoint that cannot be written (disk full, read-only run dir): the previous one stays intact,
no temporary file is left behind, and the run ends with one line and exit 5."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from aso_se.run import checkpoint
from aso_se.run.atomic_write import CheckpointWriteError, save_json
from aso_se.run.checkpoint import load_checkpoint, save_checkpoint
from tests.aso_se.run.helpers import SMOKE, RunApp


@pytest.fixture
def previous(tmp_path: Path) -> tuple[Path, torch.Tensor]:
    """A checkpoint already on disk, with random weights."""
    path = tmp_path / "checkpoints" / "last.pt"
    weights = torch.randn(1000)
    save_checkpoint({"w": weights}, path, kind="search")
    return path, weights


def _assert_intact(path: Path, weights: torch.Tensor) -> None:
    assert torch.equal(load_checkpoint(path, kind="search")["w"], weights)
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]  # no temporary file left


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_keeps_the_previous_checkpoint(previous: tuple[Path, torch.Tensor]) -> None:
    """The temporary file is a link to /dev/full: torch.save's writes fail with a real ENOSPC."""
    path, weights = previous
    path.with_name(".last.pt.tmp").symlink_to("/dev/full")
    with pytest.raises(CheckpointWriteError) as err:
        save_checkpoint({"w": torch.randn(100_000)}, path, kind="search")
    assert str(err.value) == (f"could not write checkpoint {path}: [Errno 28] No space left on device; "
                              f"free space or make {path.parent} writable")
    _assert_intact(path, weights)


def test_a_failed_rename_keeps_the_previous_checkpoint(previous: tuple[Path, torch.Tensor],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def replace(src: str, dst: str) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    path, weights = previous
    monkeypatch.setattr(checkpoint.os, "replace", replace)
    with pytest.raises(CheckpointWriteError, match=r"\[Errno 30\] Read-only file system; free space or"):
        save_checkpoint({"w": torch.randn(1000)}, path, kind="search")
    monkeypatch.undo()
    _assert_intact(path, weights)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_a_read_only_checkpoint_dir_keeps_the_previous_checkpoint(
        previous: tuple[Path, torch.Tensor]) -> None:
    path, weights = previous
    path.parent.chmod(0o500)
    try:
        with pytest.raises(CheckpointWriteError, match=r"Permission denied"):
            save_checkpoint({"w": torch.randn(1000)}, path, kind="search")
    finally:
        path.parent.chmod(0o700)
    _assert_intact(path, weights)


def test_a_json_file_in_a_missing_unwritable_place(tmp_path: Path) -> None:
    (tmp_path / "outputs").write_text("a file where the run dir should be")
    with pytest.raises(CheckpointWriteError, match=r"could not write .*genotype.json: .*; free space or make"):
        save_json({"normal": []}, tmp_path / "outputs" / "run" / "genotype.json")


def test_an_interrupt_mid_write_removes_the_temporary_file(previous: tuple[Path, torch.Tensor],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C while saving propagates as it is (the run quits at once), leaving no litter."""
    def fsync(fd: int) -> None:
        raise KeyboardInterrupt

    path, weights = previous
    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"w": torch.randn(1000)}, path, kind="search")
    monkeypatch.undo()
    _assert_intact(path, weights)


@pytest.mark.parametrize("failing_save", [2, 3])
def test_a_retrain_whose_disk_fills_up_exits_5_with_one_line(run_app: RunApp, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, failing_save: int) -> None:
    """The save of last.pt at the end of epoch ``failing_save`` hits a full disk halfway through its bytes. It is
    written in the background: the next epoch's save (2), or the end of the run (3, the last epoch), reports it."""
    real_save, saves = torch.save, []

    def save(obj, f, *args, **kwargs):
        saves.append(Path(f.name).name)
        if saves.count(".last.pt.tmp") == failing_save:
            f.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    code, stderr = run_app("train", *SMOKE, "genotype=DARTS_V2", "epochs=3", "hydra.run.dir=run")
    path = tmp_path / "run" / "checkpoints" / "last.pt"
    assert code == 5, stderr
    assert stderr == (f"error: could not write checkpoint {path}: [Errno 28] No space left on device; free space "
                      f"or make {path.parent} writable; the previous checkpoint {path} is intact; continue with: "
                      f"python train.py resume={tmp_path / 'run'}\n")
    monkeypatch.undo()
    assert load_checkpoint(path, kind="train")["trainer"]["epoch"] == failing_save - 1  # the epoch before
    assert not path.with_name(".last.pt.tmp").exists()
