"""``torchrun --max-restarts=N``: a restarted attempt continues the run that the first attempt started.

The first attempt's rank 0 names its run directory in a marker file (`name_run_for_elastic_restarts`); a
restarted worker finds it before Hydra composes its config and rewrites its command line to resume that run.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from aso_se.run.checkpoint import history
from aso_se.run.paths import CHECKPOINT, ELASTIC_MARKERS


def _elastic_marker(entry_point: str) -> Path | None:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    return ELASTIC_MARKERS / f"{entry_point}-{run_id}" if run_id else None


def resume_elastic_restart(entry_point: str) -> None:
    """A worker restarted by ``torchrun --max-restarts=N`` continues its job's run: the command line
    becomes ``resume=<the run dir the first attempt named>`` when that run saved a checkpoint;
    otherwise the attempt starts anew like the first."""
    marker = _elastic_marker(entry_point)
    if marker is None or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0 or not marker.is_file():
        return
    run_dir = marker.read_text().strip()
    if not history(Path(run_dir) / CHECKPOINT):
        return
    sys.argv[1:] = [f"resume={run_dir}"]  # the same command on the same machine: its saved config


def name_run_for_elastic_restarts(run_dir: Path, entry_point: str) -> None:
    """Rank 0 of a fresh run under torchrun --max-restarts: where a restarted attempt finds this run."""
    marker = _elastic_marker(entry_point)
    if marker is not None and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{run_dir}\n")
