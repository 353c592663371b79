"""Ranks that die or hang under torchrun, and a run resumed on another number of processes (gloo, CPU).

A rank killed with SIGKILL makes the other exit with one line (exit 6) and last.pt intact; with
``torchrun --max-restarts=1`` the job then resumes by itself and ends as the uninterrupted run. A
rank that hangs (SIGSTOP) makes the other give up after ``trainer.peer_timeout_s``.
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
import torch

from aso_se.run.checkpoint import load_checkpoint
from aso_se.run.search_callbacks import alpha_digest
from aso_se.run.tensor_checks import tensor_digest
from tests.aso_se.run.helpers import REPO

RETRAIN = ["train.py", "experiment=smoke", "logger=none", "trainer=ddp", "genotype=DARTS_V2", "epochs=5"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _torchrun(*args: str, cwd: Path, max_restarts: int = 0, log: Path) -> subprocess.Popen:
    script, *overrides = args
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
         f"--max-restarts={max_restarts}", str(REPO / script), *overrides],
        cwd=cwd, env=_env(), stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)


def _worker_of_rank(agent: subprocess.Popen, rank: int, timeout_s: float = 60) -> int:
    """The pid of the torchrun worker with RANK=rank (a child of the agent)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
        for pid in children:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ:
                return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"no worker of rank {rank} appeared")


def _wait_for(path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / "last.pt", kind="train")["trainer"]["model"]


pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds torchrun's workers in /proc")


@pytest.mark.slow
def test_a_killed_rank_stops_the_other_and_max_restarts_resumes_the_run(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    log = tmp_path / "whole.log"
    assert _torchrun(*RETRAIN, f"hydra.run.dir={whole}", cwd=tmp_path, log=log).wait(timeout=300) == 0, \
        log.read_text()[-3000:]

    killed = tmp_path / "killed"
    log = tmp_path / "killed.log"
    agent = _torchrun(*RETRAIN, f"hydra.run.dir={killed}", cwd=tmp_path, max_restarts=1, log=log)
    rank1 = _worker_of_rank(agent, 1)
    _wait_for(killed / "checkpoints" / "last.pt")  # epoch 1 saved
    os.kill(rank1, signal.SIGKILL)
    assert agent.wait(timeout=300) == 0, log.read_text()[-3000:]

    output = log.read_text()
    lines = [line for line in output.splitlines() if line.startswith("error: rank 0: another process")]
    assert len(lines) == 1 and "is intact" in lines[0], output[-3000:]
    assert "Traceback" not in output.split("error: rank 0")[0]
    assert "resumed from" in (killed / "train.log").read_text()
    assert json.loads((killed / "metrics.json").read_text())["epochs"] == 5
    expected, got = _weights(whole), _weights(killed)
    assert expected.keys() == got.keys()
    for name in expected:  # the restarted job ends exactly as the one never interrupted
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_a_hung_rank_stops_the_other_after_peer_timeout_s(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "hung", tmp_path / "hung.log"
    agent = _torchrun(*RETRAIN[:-1], "epochs=50", "trainer.peer_timeout_s=5", f"hydra.run.dir={run_dir}",
                      cwd=tmp_path, log=log)
    rank1 = _worker_of_rank(agent, 1)
    _wait_for(run_dir / "checkpoints" / "last.pt")
    os.kill(rank1, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        while "error: rank 0" not in log.read_text():
            assert time.monotonic() - stopped < 60, "rank 0 still waits for the hung rank"
            time.sleep(0.2)
        waited = time.monotonic() - stopped
    finally:
        os.kill(rank1, signal.SIGCONT)
    agent.wait(timeout=120)
    assert 4 <= waited < 30, waited  # the 5 s timeout, not gloo's 30 min default
    line = next(line for line in log.read_text().splitlines() if line.startswith("error: rank 0"))
    assert "trainer.peer_timeout_s" in line and "last.pt is intact" in line
    load_checkpoint(run_dir / "checkpoints" / "last.pt", kind="train")  # readable


@pytest.mark.slow
@pytest.mark.parametrize("entry_point", ["train", "search"])
def test_a_run_stopped_on_two_processes_resumes_on_one_with_the_global_batch(tmp_path: Path, entry_point: str) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "two.log"
    fresh = (["train.py", "experiment=smoke", "logger=none", "trainer=ddp", "genotype=DARTS_V2", "epochs=8"]
             if entry_point == "train" else
             ["search.py", "experiment=smoke", "logger=none", "trainer=ddp", "search.schedule.cycles=4"])
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
         str(REPO / fresh[0]), *fresh[1:], f"hydra.run.dir={run_dir}"],
        cwd=tmp_path, env=_env(), stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    _wait_for(run_dir / "checkpoints" / "last.pt")
    os.killpg(agent.pid, signal.SIGTERM)
    agent.wait(timeout=120)
    saved = load_checkpoint(run_dir / "checkpoints" / "last.pt", kind=entry_point)
    assert saved["world_size"] == 2 and saved["config"]["batch_size"] == 16, log.read_text()[-2000:]
    if entry_point == "train":
        step, digest = saved["trainer"]["global_step"], f"weights {tensor_digest(saved['trainer']['model'])}"
    else:
        step, digest = saved["engine"]["global_step"], f"α {alpha_digest(saved['engine']['supernet'])}"

    one = subprocess.run([sys.executable, str(REPO / f"{entry_point}.py"), f"resume={run_dir}"], cwd=tmp_path,
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    run_log = (run_dir / f"{entry_point}.log").read_text()
    assert ("resumed on 1 process (saved on 2): batch_size per process 16 -> 32, the global batch of 32 is kept"
            in run_log)
    assert f"resumed at global step {step}, {digest}" in run_log  # the same weights and α at the resume point
    result = "metrics.json" if entry_point == "train" else "genotype.json"
    assert (run_dir / result).is_file()


@pytest.mark.slow
def test_a_global_batch_the_new_processes_cannot_split_is_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.joinpath("checkpoints").mkdir(parents=True)
    state = {"config": {"batch_size": 16}, "world_size": 2}
    from aso_se.run import checkpoint
    checkpoint.save_checkpoint({**state, "trainer": {}}, run_dir / "checkpoints" / "last.pt", kind="train")
    env = {**_env(), "WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0"}
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"resume={run_dir}"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: this run trained with a global batch of 32 (batch_size=16 on 2 processes), which 3 processes cannot "
        "split evenly; resume it on a number of processes that divides 32")
