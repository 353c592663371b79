"""Where a run keeps the files that other runs, its messages and the benchmarks look for."""
from __future__ import annotations

from pathlib import Path

# In the run directory: the state a resume continues from.
CHECKPOINT = Path("checkpoints") / "last.pt"
# In the working directory, under torchrun --max-restarts: the first attempt's rank 0 names its run dir here,
# keyed by the job's rendezvous id, so that a restarted attempt resumes that run (aso_se.run.elastic_restart).
ELASTIC_MARKERS = Path("outputs") / ".torchelastic"
