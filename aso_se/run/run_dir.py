"""The run directory: Hydra's new one, or the resumed run's, and only rank 0 of a torchrun job writes one."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from aso_se.run import gpu_slots
from aso_se.run.checkpoint import CheckpointError, history
from aso_se.run.paths import CHECKPOINT
from search_space.errors import UserInputError


def register_resolvers() -> None:
    """Resolvers that ``hydra.run.dir`` and ``hydra.output_subdir`` use in conf/{search,train}.yaml.

    With ``resume=<run_dir>`` Hydra runs in that directory (after checking it holds a
    checkpoint, so a typo creates nothing) and writes the resuming invocation's config under
    ``.hydra/resume_<time>`` instead of over the original ``.hydra/config.yaml``.
    """
    if not OmegaConf.has_resolver("aso_se.gpu_slots"):  # +sweep=local_gpus: hydra.launcher.n_jobs
        OmegaConf.register_new_resolver("aso_se.gpu_slots", lambda per_gpu, gpus: (
            len(gpus) * int(per_gpu) if gpus else gpu_slots.slot_count(per_gpu)))
    if not OmegaConf.has_resolver("aso_se.stem"):  # hydra.sweep.subdir of the benchmarks: a run's name
        OmegaConf.register_new_resolver("aso_se.stem", lambda value: Path(str(value)).stem)
    if not OmegaConf.has_resolver("aso_se.per_process"):  # a recipe's global batch, split over torchrun's processes
        OmegaConf.register_new_resolver("aso_se.per_process", per_process_batch)
    if not OmegaConf.has_resolver("aso_se.run_dir"):
        OmegaConf.register_new_resolver("aso_se.run_dir", _run_dir)
        OmegaConf.register_new_resolver(
            "aso_se.hydra_subdir", lambda resume, resumed, fresh: resumed if resume else fresh)


def per_process_batch(global_batch: int) -> int:
    """Each process's share of ``global_batch``: a recipe whose learning rate is for one global batch keeps it on
    one GPU or on torchrun's WORLD_SIZE of them."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if global_batch % processes:
        raise UserInputError(f"the recipe's global batch {global_batch} does not split over {processes} processes; "
                             f"pass batch_size=<a batch per process>, e.g. {max(1, global_batch // processes)}")
    return global_batch // processes


def _run_dir(resume: str | None, fresh: str) -> str:
    if not resume:
        return fresh
    if not Path(resume).is_dir():
        raise CheckpointError(f"resume dir {resume} does not exist; pass resume=<a run "
                              f"dir under outputs/>, or drop resume= to start anew")
    if not history(Path(resume) / CHECKPOINT):
        raise CheckpointError(f"resume dir {resume} has no {CHECKPOINT} (the run saved "
                              f"none yet); drop resume= to start a new run")
    return str(resume)


def quiet_nonzero_ranks() -> None:
    """Under torchrun, ranks > 0 write no run directory, Hydra config or log file.

    Every rank composes the config and would make its own timestamped run directory (they can
    straddle a second); rank 0's directory is broadcast once the process group is up.
    """
    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv += ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=none"]
