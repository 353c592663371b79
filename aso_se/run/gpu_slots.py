"""One job per GPU for Hydra multiruns on a multi-GPU machine (``+sweep=local_gpus``).

A Hydra callback: when a job starts in a launcher's worker process (joblib), the worker takes the first
free slot of ``GPUs x jobs_per_gpu`` (an flock held for the worker's life, so concurrent sweeps on the
machine share the slots) and keeps that GPU as its only visible device (CUDA_VISIBLE_DEVICES, set
before CUDA starts). Several jobs share a GPU only when ``jobs_per_gpu`` asks for it.
"""
from __future__ import annotations

import fcntl
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from search_space.errors import UserInputError

log = logging.getLogger(__name__)
_HELD: dict[str, Any] = {}  # this process's slot: {"file": open lock file, "gpu": its GPU id}


def visible_gpus() -> list[str]:
    """The GPU ids this process may use: CUDA_VISIBLE_DEVICES if set, else nvidia-smi's list (no CUDA start)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [gpu.strip() for gpu in listed.split(",") if gpu.strip()]
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return []
    return found


def slot_count(jobs_per_gpu: int) -> int:
    """``hydra.launcher.n_jobs`` for ``jobs_per_gpu``: every slot of this machine (1 without a GPU)."""
    return max(1, len(visible_gpus()) * int(jobs_per_gpu))


class GPUSlots(Callback):
    """``hydra.callbacks.gpu_slots``; ``gpus``: ids to share out (null: the visible ones)."""

    def __init__(self, jobs_per_gpu: int = 1, gpus: list[Any] | None = None,
                 lock_dir: str = "/tmp/aso_se_gpu_slots") -> None:
        if isinstance(jobs_per_gpu, bool) or not isinstance(jobs_per_gpu, int) or jobs_per_gpu < 1:
            raise UserInputError(f"sweep jobs_per_gpu={jobs_per_gpu!r} must be an integer >= 1")
        self.jobs_per_gpu, self.lock_dir = jobs_per_gpu, Path(lock_dir)
        self.gpus = [str(gpu) for gpu in gpus] if gpus is not None else None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if _HELD:  # a worker that ran a job before keeps its GPU (CUDA may have started on it)
            log.info("GPU slot kept: CUDA_VISIBLE_DEVICES=%s", _HELD["gpu"])
            return
        gpus = self.gpus if self.gpus is not None else visible_gpus()
        if not gpus:
            return  # no GPU here: the jobs run on the CPU
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        for slot in range(len(gpus) * self.jobs_per_gpu):
            gpu = gpus[slot % len(gpus)]  # the first round of slots puts one job on every GPU
            lock = open(self.lock_dir / f"gpu{gpu}_slot{slot // len(gpus)}.lock", "w")  # held while the process lives
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            _HELD.update(file=lock, gpu=gpu)
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
            log.info("GPU slot %d: CUDA_VISIBLE_DEVICES=%s", slot, gpu)
            return
        raise UserInputError(f"all {len(gpus) * self.jobs_per_gpu} GPU slots are taken ({len(gpus)} GPUs x "
                             f"jobs_per_gpu={self.jobs_per_gpu}); lower hydra.launcher.n_jobs or raise "
                             f"sweep.jobs_per_gpu")
