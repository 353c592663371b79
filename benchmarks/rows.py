"""Result rows: every suite appends its measurements to one CSV file per question in benchmarks/results/, and
benchmarks/report.py builds RESULTS.md from those files.

A row is one measured number with what is needed to trust and repeat it: the code's commit, the date, the GPU (or
"cpu"), the torch and triton versions, the command that measured it, the suite's case, the metric, the value and its
unit, and a free-text note (seed, arm, caveat). Rows are only ever appended; the report shows the newest row of each
(case, metric) unless its table aggregates them (e.g. mean ± std over seeds).
"""
from __future__ import annotations

import csv
import datetime
import os
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
COLUMNS = ("date", "commit", "gpu", "torch", "triton", "command", "case", "metric", "value", "unit", "note")


@dataclass(frozen=True)
class Measurement:
    """What a suite's case measured; the row adds where and how (``environment``)."""

    case: str
    metric: str
    value: float
    unit: str = ""
    note: str = ""


def _git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # a copy of the tree without .git: the commit it was made from
        return os.environ.get("ASO_SE_COMMIT", "unknown")
    return f"{commit}+dirty" if dirty else commit  # a dirty tree is not the commit: say so


def environment() -> dict[str, str]:
    """Where this process runs: commit, date, GPU name (or "cpu") and the torch and triton versions."""
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = ""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"date": datetime.date.today().isoformat(), "commit": _git_commit(), "gpu": gpu,
            "torch": torch.__version__, "triton": triton_version}


def this_command() -> str:
    """The command line that started this process, as a user would type it from the repository root."""
    return " ".join(["python", *map(shlex.quote, sys.argv)])


def append_rows(path: Path, measurements: Iterable[Measurement], command: str | None = None) -> int:
    """Appends one row per measurement to ``path`` (the header first if the file is new); returns the count."""
    env = {**environment(), "command": command or this_command()}
    rows = [{**env, **{f.name: getattr(m, f.name) for f in fields(m)}} for m in measurements]
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
        if new:
            writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of one file, in file order (oldest first); ``value`` stays text (the report formats it)."""
    with open(path, newline="") as source:
        reader = csv.DictReader(source)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: columns {reader.fieldnames}, expected {list(COLUMNS)}")
        return list(reader)


def print_measurements(measurements: Iterable[Measurement]) -> None:
    for m in measurements:
        print(" | ".join(str(v) for v in asdict(m).values()))
