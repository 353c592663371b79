"""What the benchmarks that run search.py and train.py share: the Hydra overrides they check and compose,
their stages as Hydra multiruns (``python search.py -m ...`` on a launcher plugin), and reading a run dir back.

search_vs_random.py, qann_vs_relu.py and energy_pareto.py (the accuracy suite) import it; it is a
library, not a script (each script puts the repository on sys.path before importing it).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import yaml

from aso_se.run.paths import CHECKPOINT
from aso_se.run.resume import RESUME_KEYS, is_launcher_override
from aso_se.run.run_dir import register_resolvers
from search_space.errors import UserInputError

REPO = Path(__file__).resolve().parents[1]
# Keys search_vs_random.py sets for every run itself (check_overrides' default); every benchmark also sets
# the multiruns' own keys (SWEEP_KEYS).
RESERVED_KEYS = ("seed", "genotype", "resume")
SWEEP_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir", "sweep")
SMOKE = ("experiment=smoke", "logger=none")


class BenchmarkError(RuntimeError):
    """A run failed or wrote unexpected output; the message is one line naming the run and its log."""


# ----------------------------------------------------------------------------- overrides
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
        if key in SWEEP_KEYS:
            raise UserInputError(f"the override {override!r} sets {key}, which the benchmark sets for every "
                                 "multirun; drop it (--out sets the run dirs, --launcher the launcher)")
        checked.append(override)
    return tuple(checked)


def compose_config(config_name: str, overrides: Sequence[str], launcher: str = "basic") -> Any:
    """The config ``overrides`` give ``config_name`` (search, train) under ``launcher``: bad ones are refused
    before any run. ``launcher``'s sweep config is composed too, so hydra.launcher.* overrides are checked."""
    from hydra import compose, initialize_config_dir

    register_resolvers()  # the configs' own interpolations (a recipe's per-process batch) resolve as in a run
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3", job_name=config_name):
            return compose(config_name=config_name, overrides=[*LAUNCHERS[launcher], *overrides])
    except Exception as error:  # Hydra's and OmegaConf's many error types: all mean bad overrides here
        message = " ".join(str(error).split())
        raise UserInputError(f"{config_name}.py rejects the overrides {list(overrides)}: {message}; "
                             "fix them (--search-override/--train-override for one entry point only)") from None


# ----------------------------------------------------------------------------- sweeps
# --launcher: the Hydra launcher of every multirun. basic: Hydra's own, the jobs one after another in one
# process (what CI uses); local_gpus: one job per GPU of this machine; slurm: a Slurm job each (conf/sweep/).
LAUNCHERS = {"basic": (), "local_gpus": ("+sweep=local_gpus",), "slurm": ("+sweep=slurm",),
             "slurm_local": ("+sweep=slurm_local",)}
DONE_FILE = {"search.py": "genotype.json", "train.py": "metrics.json"}  # in a run dir: the run finished


@dataclass(frozen=True)
class Sweep:
    """One Hydra multirun: ``script`` with ``overrides`` and ``key`` swept over ``values``; the job of
    ``values[i]`` runs in ``stage_dir / names[i]``, which ``subdir`` (Hydra's interpolation) must give."""

    label: str  # names its log: DIR/logs/<label>.log
    script: str
    stage_dir: Path
    overrides: tuple[str, ...]
    key: str
    values: tuple[str, ...]
    names: tuple[str, ...]
    subdir: str

    def run_dirs(self) -> list[Path]:
        return [self.stage_dir / name for name in self.names]

    def resume_command(self, launcher: Sequence[str], run_dirs: Sequence[Path]) -> list[str]:
        """The multirun that continues ``run_dirs`` from their checkpoints (``resume=``, each in its own dir); of
        the sweep's overrides it keeps those a resume takes (the machine's data, the SNN evaluation, the launcher),
        forced (``++data.root=``): the config a resume composes, mnist5k's, has no data.root to override."""
        kept = [o if is_launcher_override(o) else "++" + o.lstrip("+") for o in self.overrides
                if o.split("=", 1)[0].lstrip("+") in RESUME_KEYS or is_launcher_override(o)]
        return ["python", self.script, "-m", *launcher, *kept,
                f"resume={','.join(quoted(run_dir) for run_dir in run_dirs)}",
                f"hydra.sweep.dir={quoted(self.stage_dir)}", "hydra.sweep.subdir='${aso_se.stem:${resume}}'"]

    def command(self, launcher: Sequence[str] = (), values: Sequence[str] | None = None) -> list[str]:
        """The multirun's command line (``values``: a part of the sweep, e.g. the unfinished jobs)."""
        return ["python", self.script, "-m", *launcher, *self.overrides,
                f"{self.key}={','.join(self.values if values is None else values)}",
                f"hydra.sweep.dir={quoted(self.stage_dir)}", f"hydra.sweep.subdir={quoted(self.subdir)}"]


def shell_word(word: str) -> str:
    """``word`` for a shell, readably: Hydra's single-quoted values inside double quotes where that is safe."""
    if "'" in word and not any(char in word for char in '"`\\!'):
        return '"' + word.replace("$", "\\$") + '"'
    return shlex.quote(word)


def finished(run_dir: Path, script: str) -> bool:
    """The run wrote its finished file; for train.py, a metrics.json whose evaluations are still ``pending`` (its
    machine was lost during them) counts only when no checkpoint is left to redo them from."""
    done = run_dir / DONE_FILE[script]
    if not done.is_file():
        return False
    return script != "train.py" or "pending" not in json.loads(done.read_text()) or not (run_dir / CHECKPOINT).is_file()


def run_sweeps(sweeps: Sequence[Sweep], launcher: str, resume: bool, log_dir: Path) -> list[Path]:
    """Runs each sweep as ``python <script> -m ...`` on ``launcher``, one after another; the run dirs of all.

    With ``resume`` a job whose run dir holds its finished file (DONE_FILE) is left out of the sweep; an
    unfinished one that saved a checkpoint goes on from it (a second multirun, ``resume=`` its dirs), and one
    that saved none is deleted and run again (a multirun cannot skip jobs); a sweep with nothing left is not run.
    So a benchmark whose runs outlast one allocation continues with ``--resume`` in the next.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for sweep in sweeps:
        todo = [(value, run_dir) for value, run_dir in zip(sweep.values, sweep.run_dirs())
                if not (resume and finished(run_dir, sweep.script))]
        if not todo:
            continue
        carried = [run_dir for _, run_dir in todo if resume and (run_dir / CHECKPOINT).is_file()]
        fresh = [(value, run_dir) for value, run_dir in todo if run_dir not in carried]
        for _, run_dir in fresh:
            if run_dir.exists():  # only with --resume: an unfinished run without a checkpoint, redone from scratch
                shutil.rmtree(run_dir)
        multiruns = []  # (log label, command, its run dirs)
        if fresh:
            multiruns.append((sweep.label, sweep.command(LAUNCHERS[launcher], [value for value, _ in fresh]),
                              [run_dir for _, run_dir in fresh]))
        if carried:
            multiruns.append((f"{sweep.label}_resumed", sweep.resume_command(LAUNCHERS[launcher], carried), carried))
        for label, command, run_dirs in multiruns:
            log = log_dir / f"{label}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            print(f"$ {' '.join(map(shell_word, command))}", flush=True)
            with open(log, "wb") as out:
                code = subprocess.run([sys.executable, *command[1:]], cwd=REPO, env=env, stdout=out,
                                      stderr=subprocess.STDOUT).returncode
            failed = [run_dir for run_dir in run_dirs if not finished(run_dir, sweep.script)]
            if code != 0 or failed:
                raise BenchmarkError(_failure(code, failed, log))
    return [run_dir for sweep in sweeps for run_dir in sweep.run_dirs()]


def _failure(code: int, failed: Sequence[Path], log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    last = f": {lines[-1]}" if lines else ""
    runs = ", ".join(str(run_dir) for run_dir in failed) or "none unfinished"
    return f"a multirun failed (exit {code}; unfinished: {runs}); its log is {log}{last}"


# ----------------------------------------------------------------------------- reading the runs
def add_launcher_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--launcher", default="basic", choices=tuple(LAUNCHERS),
                        help="Hydra launcher of every multirun: basic (one job after another), local_gpus (one "
                             "job per GPU; sweep.jobs_per_gpu=N for more), slurm (hydra.launcher.partition=...), "
                             "slurm_local (submitit's local executor)")
    parser.add_argument("--resume", action="store_true",
                        help="continue a stopped benchmark in --out (same arguments): finished runs are kept, "
                             "unfinished ones redone")
    parser.add_argument("--parallel", help=argparse.SUPPRESS)  # gone: refused with a hint (check_launcher_args)


def check_launcher_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.parallel is not None:
        parser.error("--parallel is gone: the runs are Hydra multiruns; pass --launcher local_gpus (one job per "
                     "GPU, sweep.jobs_per_gpu=N for N per GPU) or --launcher slurm")


def run_into_out(tool: str, args: argparse.Namespace, run: Callable[[argparse.Namespace], Any]) -> tuple[int, Any]:
    """``run(args)`` into ``args.out``, which must be empty unless --resume: (0, its summary), or (2, None) after a
    user's mistake and (1, None) after a failed run, the one-line reason printed."""
    try:
        if args.out.exists() and any(args.out.iterdir()) and not args.resume:
            raise UserInputError(f"--out {args.out} is not empty; pass a new directory or --resume")
        return 0, run(args)
    except (UserInputError, BenchmarkError) as error:
        print(f"{tool}: {error}", file=sys.stderr)
        return (2 if isinstance(error, UserInputError) else 1), None


def read_run_json(path: Path) -> Any:
    if not path.is_file():
        raise BenchmarkError(f"run {path.parent} finished without writing {path.name}; its log is in {path.parent}")
    return json.loads(path.read_text())


def with_overrides(cfg: Any, overrides: Sequence[str]) -> Any:
    """An OmegaConf config (a run's saved one) with ``key=value`` overrides applied in place, e.g. this machine's
    data.root; it is returned."""
    from omegaconf import OmegaConf

    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep:
            raise UserInputError(f"{override!r} is not an override; write key=value (e.g. data.root=/tmp/cifar10)")
        OmegaConf.update(cfg, key.lstrip("+"), yaml.safe_load(value), merge=False)
    return cfg


def run_config(run_dir: Path) -> dict[str, Any]:
    return yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())


def run_labels(runs: Sequence[Path]) -> list[str]:
    """Each run's column: its dir name, or ``<protocol>:<name>`` where two protocols' runs share a name
    (``retrain/search_0_seed0`` of two benchmark dirs), so that no run hides another."""
    resolved = [run.resolve() for run in runs]
    if len(set(resolved)) < len(resolved):
        raise UserInputError("a run dir is passed twice; pass each run once")
    names = [run.name for run in resolved]
    labels = [f"{run.parent.parent.name}:{run.name}" if names.count(run.name) > 1 else run.name for run in resolved]
    if len(set(labels)) < len(labels):
        raise UserInputError("two runs share their dir name and their benchmark dir's; pass runs of distinct dirs")
    return labels


def collect_retrain(run_dir: Path, source: str) -> dict[str, Any]:
    """A finished train.py run: test figures, genotype and minutes (wall and CPU, as the run measured them)."""
    metrics = read_run_json(run_dir / "metrics.json")
    finetuned = metrics.get("snn_finetune") or {}
    return {"test_acc": metrics["test_acc"], "best_test_acc": metrics.get("best_test_acc"),
            # the binary SNN a user deploys: the fine-tuned one where train.py fine-tuned it, else the converted one
            "snn_acc_at_t": finetuned.get("acc_at_t", metrics.get("snn_acc_at_t", {})),
            "snn_energy_uj": finetuned.get("energy_per_image_uj", metrics.get("energy_per_image_uj")),
            "params_m": metrics["params_m"], "firing_rate_mean": metrics.get("firing_rate_mean"),
            "snn_test_acc": metrics.get("snn_test_acc"), "energy_per_image_uj": metrics.get("energy_per_image_uj"),
            "genotype": json.loads(metrics["genotype"]), "run_dir": str(run_dir), "source": source,
            "device": metrics.get("device"), "seed": run_config(run_dir)["seed"],
            "wall_minutes": metrics["wall_time_s"] / 60,
            "cpu_minutes": None if metrics["cpu_time_s"] is None else metrics["cpu_time_s"] / 60,
            "pending": metrics.get("pending", []), "recovered_from": metrics.get("recovered_from")}


def budget_config(run_dir: Path) -> dict[str, Any]:
    """The run's composed config as a budget: how many processes shared it does not count, so ``batch_size`` is the
    global batch (its metrics.json's, else ``batch_size`` × its ``world_size``) and ``trainer.ddp`` is left out."""
    config = run_config(run_dir)
    config.get("trainer", {}).pop("ddp", None)
    metrics_path = run_dir / "metrics.json"
    if "batch_size" in config and metrics_path.is_file():
        metrics = json.loads(metrics_path.read_text())
        config["batch_size"] = metrics.get("global_batch_size", config["batch_size"] * metrics.get("world_size", 1))
    return config


def drop_key(config: dict[str, Any], key: str) -> None:
    """Removes ``key`` from ``config``, a dotted key from its nested mapping (``optim.optimizer.lr``), if present."""
    *parents, leaf = key.split(".")
    for parent in parents:
        config = config.get(parent)
        if not isinstance(config, dict):
            return
    config.pop(leaf, None)


def same_config(run_dirs: Sequence[Path], ignore: Sequence[str]) -> dict[str, Any]:
    """The budget every run got (``budget_config``), less the keys in ``ignore`` (dotted keys name nested ones):
    one budget, or a BenchmarkError."""
    configs = {}
    for run_dir in run_dirs:
        config = budget_config(run_dir)
        for key in ignore:
            drop_key(config, key)  # a key newer than the run (e.g. init_from) is not a difference
        configs[run_dir] = config
    (first_dir, first), *_ = configs.items()
    for run_dir, config in configs.items():
        if config != first:
            raise BenchmarkError(f"runs {first_dir.name} and {run_dir.name} ran with different configs; compare "
                                 f"{run_dir / '.hydra' / 'config.yaml'} with {first_dir.name}'s")
    return first


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1; None for fewer than 2 values)."""
    if not values:
        raise ValueError("mean_std needs at least one value")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None
