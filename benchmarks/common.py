"""What the benchmarks that run search.py and train.py share: the job and its result, the Hydra overrides
they check and compose, the subprocess runner, and reading a finished run back.

search_vs_random.py, qann_vs_relu.py, sparse_end_to_end.py and energy_pareto.py import it; it is a
library, not a script (each script puts the repository on sys.path before importing it).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

from aso_se.run.checkpoint import save_json
from search_space.errors import UserInputError

REPO = Path(__file__).resolve().parents[1]
# Keys search_vs_random.py sets for every run itself (check_overrides' default).
RESERVED_KEYS = ("seed", "genotype", "resume", "hydra.run.dir")
SMOKE = ("experiment=smoke", "logger=none")


class BenchmarkError(RuntimeError):
    """A run failed or wrote unexpected output; the message is one line naming the run and its log."""


# ----------------------------------------------------------------------------- jobs and overrides
@dataclass(frozen=True)
class Job:
    """One subprocess: ``script`` (search.py or train.py) with ``overrides``, logging to ``log``."""

    name: str
    arm: str
    script: str
    overrides: tuple[str, ...]
    run_dir: Path
    log: Path
    seed: int
    source: str  # the cell's origin: search_<s>, random_<i>, DARTS_V2, POOR_POOL_SKIP


@dataclass(frozen=True)
class JobResult:
    job: Job
    returncode: int
    wall_s: float
    cpu_s: float


def quoted(value: str | Path) -> str:
    """A Hydra override value quoted, so that paths with spaces, '=' or ',' pass through."""
    text = str(value)
    if "'" in text:
        raise UserInputError(f"the path {text!r} contains a single quote, which Hydra overrides cannot carry; "
                             "choose another --out directory")
    return f"'{text}'"


def check_overrides(
    overrides: Iterable[str], reserved: Sequence[str] = RESERVED_KEYS,
    instead: str = "seeds: --searches, --randoms, --retrain-seeds",
) -> tuple[str, ...]:
    """The user's Hydra overrides, refusing the ``reserved`` keys the benchmark sets for every run
    (``instead``: the benchmark's options that set them)."""
    checked = []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if "=" not in override and not override.startswith("~"):
            raise UserInputError(f"{override!r} is not a Hydra override; write key=value (e.g. data=cifar10)")
        if key in reserved:
            raise UserInputError(f"the override {override!r} sets {key}, which the benchmark sets for every run; "
                                 f"drop it ({instead})")
        checked.append(override)
    return tuple(checked)


def compose_config(config_name: str, overrides: Sequence[str]) -> Any:
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3", job_name=config_name):
            return compose(config_name=config_name, overrides=list(overrides))
    except Exception as error:  # Hydra's and OmegaConf's many error types: all mean bad overrides here
        message = " ".join(str(error).split())
        raise UserInputError(f"{config_name}.py rejects the overrides {list(overrides)}: {message}; "
                             "fix them (--search-override/--train-override for one entry point only)") from None


# ----------------------------------------------------------------------------- running
DONE = "benchmark_run.json"  # in a run dir: the run finished (exit 0); its wall and CPU seconds


class Runner:
    """Runs jobs as subprocesses, ``parallel`` at once; on the first failure stops the others.

    ``resume``: a job whose run dir holds ``DONE`` is not run again (its recorded result is used);
    an unfinished one is deleted and run from scratch.
    """

    def __init__(self, parallel: int, env: Mapping[str, str], resume: bool = False) -> None:
        self._resume = resume
        self._pool = ThreadPoolExecutor(max_workers=parallel)
        self._env = dict(env)
        self._lock = threading.Lock()
        self._running: dict[int, subprocess.Popen[bytes]] = {}
        self._stopping = False

    def _run(self, job: Job) -> JobResult:
        done = job.run_dir / DONE
        if self._resume and done.is_file():
            record = json.loads(done.read_text())
            return JobResult(job, returncode=0, wall_s=record["wall_s"], cpu_s=record["cpu_s"])
        if self._resume and job.run_dir.exists():
            shutil.rmtree(job.run_dir)
        job.log.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with self._lock:
            if self._stopping:
                return JobResult(job, returncode=-1, wall_s=0.0, cpu_s=0.0)
            with open(job.log, "wb") as log:
                process = subprocess.Popen([sys.executable, str(REPO / job.script), *job.overrides],
                                           stdout=log, stderr=subprocess.STDOUT, env=self._env)
            self._running[process.pid] = process
        # wait4, not Popen.wait: it also gives this child's own CPU time, exact with parallel runs.
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        with self._lock:
            del self._running[process.pid]
        result = JobResult(job, process.returncode, time.perf_counter() - started, usage.ru_utime + usage.ru_stime)
        if result.returncode == 0:
            save_json({"wall_s": result.wall_s, "cpu_s": result.cpu_s}, done)
        return result

    def _stop(self) -> None:
        with self._lock:
            self._stopping = True
            for process in self._running.values():
                process.terminate()  # the entry points save a checkpoint and exit on SIGTERM

    def run_all(self, jobs: Sequence[Job], follow_up: Callable[[JobResult], list[Job]]) -> list[JobResult]:
        """Runs ``jobs`` and, as each finishes, the jobs ``follow_up`` returns for it; all results."""
        results: list[JobResult] = []
        pending: set[Future[JobResult]] = {self._pool.submit(self._run, job) for job in jobs}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: f.result().job.name):
                    result = future.result()
                    if result.returncode != 0:
                        raise BenchmarkError(_failure(result))
                    results.append(result)
                    pending |= {self._pool.submit(self._run, job) for job in follow_up(result)}
        except BaseException:
            self._stop()
            raise
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        return results


def _failure(result: JobResult) -> str:
    lines = [line.strip() for line in result.job.log.read_text(errors="replace").splitlines() if line.strip()]
    last = f": {lines[-1]}" if lines else ""
    return f"run {result.job.name} failed (exit {result.returncode}); its log is {result.job.log}{last}"


def child_env(parallel: int) -> dict[str, str]:
    """The runs' environment: unbuffered logs; with parallel runs, the CPU threads shared out."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if parallel > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // parallel))
    return env

# ----------------------------------------------------------------------------- reading the runs
def read_run_json(path: Path, job: Job) -> Any:
    if not path.is_file():
        raise BenchmarkError(f"run {job.name} finished without writing {path}; its log is {job.log}")
    return json.loads(path.read_text())


def run_config(job: Job) -> dict[str, Any]:
    return yaml.safe_load((job.run_dir / ".hydra" / "config.yaml").read_text())


def collect_retrain(result: JobResult) -> dict[str, Any]:
    job = result.job
    metrics = read_run_json(job.run_dir / "metrics.json", job)
    return {"test_acc": metrics["test_acc"], "best_test_acc": metrics.get("best_test_acc"),
            "params_m": metrics["params_m"], "firing_rate_mean": metrics.get("firing_rate_mean"),
            "genotype": json.loads(metrics["genotype"]), "run_dir": str(job.run_dir), "source": job.source,
            "device": metrics.get("device"),
            "seed": job.seed, "wall_minutes": result.wall_s / 60, "cpu_minutes": result.cpu_s / 60}


def same_config(results: Sequence[JobResult], ignore: Sequence[str]) -> dict[str, Any]:
    """The composed config every run got, less the keys in ``ignore``: one budget, or a BenchmarkError."""
    configs = {}
    for result in results:
        config = run_config(result.job)
        for key in ignore:
            config.pop(key)
        configs[result.job] = config
    (first_job, first), *_ = configs.items()
    for job, config in configs.items():
        if config != first:
            raise BenchmarkError(f"runs {first_job.name} and {job.name} ran with different configs; compare "
                                 f"{job.run_dir / '.hydra' / 'config.yaml'} with {first_job.name}'s")
    return first


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1; None for fewer than 2 values)."""
    if not values:
        raise ValueError("mean_std needs at least one value")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None
