"""Multiruns on Hydra launcher plugins: +sweep=local_gpus (joblib, one job per GPU slot) and the Slurm
path through submitit's local executor (+sweep=slurm_local), each on two smoke retrains."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.aso_se.run.helpers import REPO, SMOKE


def _multirun(*overrides: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(REPO / "train.py"), "-m", *SMOKE, "genotype=DARTS_V2", "seed=0,1",
                           "hydra.sweep.dir=sweep", *overrides], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def _jobs(sweep_dir: Path) -> dict[int, dict]:
    return {int(job.name): json.loads((job / "metrics.json").read_text())
            for job in sweep_dir.iterdir() if job.name.isdigit()}


@pytest.mark.slow
def test_local_gpus_runs_one_job_per_gpu_slot(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    result = _multirun("+sweep=local_gpus", "sweep.gpus=[7,9]", f"sweep.lock_dir={locks}", "data.num_workers=1",
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = _jobs(tmp_path / "sweep")
    assert sorted(jobs) == [0, 1] and all(0.0 <= job["test_acc"] <= 1.0 for job in jobs.values())
    slots = [line.split(" - ")[-1] for job in (0, 1)
             for line in (tmp_path / "sweep" / str(job) / "train.log").read_text().splitlines() if "GPU slot" in line]
    # two launcher processes side by side (n_jobs = 2 GPUs x 1), each with a GPU of its own
    assert sorted(slots) == ["GPU slot 0: CUDA_VISIBLE_DEVICES=7", "GPU slot 1: CUDA_VISIBLE_DEVICES=9"], slots


def test_the_slurm_sweep_runs_through_submitits_local_executor(tmp_path: Path) -> None:
    result = _multirun("+sweep=slurm_local", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = _jobs(tmp_path / "sweep")
    assert sorted(jobs) == [0, 1] and jobs[0]["test_acc"] >= 0.0
    assert (tmp_path / "sweep" / ".submitit").is_dir()
