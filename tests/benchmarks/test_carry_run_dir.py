"""benchmarks/carry_run_dir.sh: a run dir packed into parts unpacks to the same files elsewhere."""

import os
import random
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "carry_run_dir.sh"


def carry(*args: str, part_size: str = "4k") -> subprocess.CompletedProcess:
    env = {**os.environ, "PART_SIZE": part_size}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, check=False)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "src" / "search_1_seed0"
    (run / "checkpoints").mkdir(parents=True)
    rng = random.Random(0)
    # Random bytes: gzip cannot shrink them below one part, so several parts are written.
    (run / "checkpoints" / "last.pt").write_bytes(rng.randbytes(20_000))
    (run / "checkpoints" / "best.pt").write_bytes(rng.randbytes(100))
    (run / "checkpoints" / "last.1.pt").write_bytes(rng.randbytes(100))
    (run / "checkpoints" / ".last.pt.tmp").write_bytes(rng.randbytes(100))
    (run / "train.log").write_text("retrain epoch 91/180 | test_acc 0.8679\n")
    return run


def test_pack_then_unpack_gives_the_same_files_without_the_left_out_ones(run_dir: Path, tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    result = carry("pack", str(run_dir), str(parts))
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in parts.iterdir())
    assert len(names) >= 5 and all(n.startswith("search_1_seed0.tar.part-") for n in names)
    target = tmp_path / "dst" / "search_1_seed0"
    result = carry("unpack", str(parts), str(target))
    assert result.returncode == 0, result.stderr
    got = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert got == ["checkpoints/last.pt", "train.log"]
    for rel in got:
        assert (target / rel).read_bytes() == (run_dir / rel).read_bytes()


def test_a_new_pack_replaces_the_old_parts(run_dir: Path, tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    assert carry("pack", str(run_dir), str(parts)).returncode == 0
    (run_dir / "checkpoints" / "last.pt").write_bytes(b"epoch 92")
    assert carry("pack", str(run_dir), str(parts)).returncode == 0
    assert len(list(parts.iterdir())) == 1  # no part of the bigger, older pack is left to corrupt the unpack
    target = tmp_path / "dst" / "search_1_seed0"
    assert carry("unpack", str(parts), str(target)).returncode == 0
    assert (target / "checkpoints" / "last.pt").read_bytes() == b"epoch 92"


def test_unpack_leaves_an_existing_run_dir_alone(run_dir: Path, tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    assert carry("pack", str(run_dir), str(parts)).returncode == 0
    (run_dir / "train.log").write_text("newer\n")
    assert carry("unpack", str(parts), str(run_dir)).returncode == 0
    assert (run_dir / "train.log").read_text() == "newer\n"


def test_a_missing_run_dir_is_a_clear_error_that_keeps_the_old_parts(run_dir: Path, tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    assert carry("pack", str(run_dir), str(parts)).returncode == 0
    before = sorted(parts.iterdir())
    result = carry("pack", str(tmp_path / "nope" / "search_1_seed0"), str(parts))
    assert result.returncode == 1
    assert "no run dir" in result.stderr and result.stderr.count("\n") == 1
    assert sorted(parts.iterdir()) == before


def test_a_part_lost_on_the_way_is_an_error(run_dir: Path, tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    assert carry("pack", str(run_dir), str(parts)).returncode == 0
    sorted(parts.iterdir())[-1].unlink()
    result = carry("unpack", str(parts), str(tmp_path / "dst" / "search_1_seed0"))
    assert result.returncode == 1
    assert "do not unpack" in result.stderr
    assert list((tmp_path / "dst").iterdir()) == []  # no half run dir for a resume to trust


def test_wrong_arguments_print_the_usage() -> None:
    result = carry("pack", "only-one")
    assert result.returncode == 2 and "usage:" in result.stderr
