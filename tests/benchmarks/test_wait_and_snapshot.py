"""benchmarks/wait_and_snapshot.sh: a device call's wait ends when its jobs end, and always leaves a snapshot."""

import os
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "wait_and_snapshot.sh"


def wait(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "POLL_S": "0.2", "PART_SIZE": "4k"}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, check=False)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run" / "search_0_seed0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(os.urandom(9_000))
    (run / "train.log").write_text("retrain epoch 54/180 | test_acc 0.7481\n")
    return run


def test_a_job_that_ended_ends_the_wait_at_once_and_its_run_dir_is_packed(run_dir: Path, tmp_path: Path) -> None:
    done = tmp_path / "DONE"
    done.touch()
    start = time.monotonic()
    result = wait("300", str(tmp_path / "carry"), str(done), "--", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - start < 60  # far from the 300 s it was allowed
    parts = sorted((tmp_path / "carry").iterdir())
    assert len(parts) >= 2 and all(p.name.startswith("search_0_seed0.tar.part-") for p in parts)


def test_jobs_still_running_at_the_deadline_exit_3_with_a_snapshot(run_dir: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "a.DONE", tmp_path / "b.DONE"
    first.touch()
    result = wait("1", str(tmp_path / "carry"), str(first), str(second), "--", str(run_dir))
    assert result.returncode == 3
    assert "still running" in result.stdout and str(second) in result.stdout and str(first) not in result.stdout
    assert any((tmp_path / "carry").iterdir())


def test_a_run_dir_not_written_yet_is_named_and_the_others_are_packed(run_dir: Path, tmp_path: Path) -> None:
    done = tmp_path / "DONE"
    done.touch()
    missing = tmp_path / "run" / "search_1_seed0"
    result = wait("5", str(tmp_path / "carry"), str(done), "--", str(missing), str(run_dir))
    assert result.returncode == 0
    assert f"no run dir {missing}" in result.stderr
    assert all(p.name.startswith("search_0_seed0.") for p in (tmp_path / "carry").iterdir())


@pytest.mark.parametrize("args", [("x", "c", "d", "--", "r"), ("5", "c", "d", "r"), ("5", "c", "--", "r"), ("5",)])
def test_bad_arguments_are_a_one_line_error(args: tuple[str, ...], tmp_path: Path) -> None:
    result = wait(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "wait_and_snapshot.sh" in result.stderr
