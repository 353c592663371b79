"""Searched vs random cells: does the search find cells better than chance, under one retrain budget?

Two Hydra multiruns: S searches (``search.py -m seed=0,..`` in DIR/search/search_<s>), then every cell
(searched, R random genotypes drawn under the search's derivation rules, DARTS_V2 and PC_DARTS as
references, POOR_POOL_SKIP as a floor; all in DIR/genotypes/) retrained by ``train.py -m genotype=<cells>`` under the
same overrides, one multirun per retrain seed (DIR/retrain/<cell>_seed<s>). Each multirun's command is
printed: rerun a cell or add one by hand with it. Writes DIR/summary.json, summary.md and summary.png (and, for
QANN retrains, pareto.png: the binary SNN's accuracy at T = 8 against its energy), read from the run dirs, with the
verdict on the judged quantity (--judge): searched mean >= random mean + 1 std, and >= DARTS_V2's; prints the table
last. The CIFAR-10 protocol (search: experiment=cifar10_snn, or
cifar10_qann with --experiment; retrain: the same experiment with epochs=30 model.network.layers=8
model.network.channels=16: --budget proxy, the default; --budget full retrains experiment=cifar10_qann_fast,
DARTS's 20 x 36 network for 180 epochs in fp16, after cifar10_qann searches), e.g. one job per GPU of this
machine, or on Slurm:

    python benchmarks/search_vs_random.py --out DIR --searches 3 --randoms 5 --launcher local_gpus data.root=<cifar10>
    python benchmarks/search_vs_random.py --out DIR --launcher slurm hydra.launcher.partition=<p> data.root=<cifar10>
    python benchmarks/search_vs_random.py --out DIR --smoke    # every code path in about a minute on a CPU

``--warm-start N`` retrains every cell the way a few-level QANN keeps its accuracy: as ReLU first (the same budget,
DIR/retrain_relu/<cell>_seed<s>), then the judged retrain for N epochs from that run's weights with LSQ thresholds
(``init_from``, ``threshold_init=lsq``, ``--warm-lr``); so cells are judged on the deployed SNN of that route.

``--resume`` continues a stopped benchmark in DIR. Its finished runs need only their small files (run config,
genotype.json and search_metrics.json, or an older search's search_summary.json; metrics.json): DIR without
checkpoints/ and tb/ can be carried to another machine, where ``--resume`` runs only what is left (unfinished runs
there start again). ``--searches-only`` stops after the searches; a retrain run dir made by hand (e.g. on several GPUs
with torchrun, the same config for every cell) in DIR/retrain/<cell>_seed<s> counts as finished once it holds its
metrics.json. ``--searches-from FULL`` retrains the finished searches of the benchmark in FULL instead of searching:
the same cells under another budget. ``--cells-only`` writes only the cells fixed before any search (DIR/genotypes/).
``--progress`` runs nothing: it reports DIR's finished retrains, the missing ones (with the last logged epoch of those
that have a train.log), the verdict so far and how far apart the searched cells in DIR/genotypes/ are.

A benchmark below the full budget also ranks its cells against the full budget's result rows of the same cells
(Kendall τ-b, by genotype; ``rank_agreement`` in the summary, a row through accuracy.py; not defined below three cells
in common). ``--rank-rows LABEL`` runs nothing: it computes that τ from the result rows of case LABEL/<arm>, for a
benchmark that retrained the full benchmark's cells (``--searches-from``), and appends it as a row.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.run.atomic_write import save_json  # noqa: E402
from aso_se.run.checkpoint import load_checkpoint  # noqa: E402
from benchmarks.accuracy import ranking_row  # noqa: E402
from benchmarks.common import (  # noqa: E402
    SMOKE,
    BenchmarkError,
    Sweep,
    add_launcher_args,
    check_launcher_args,
    check_overrides,
    collect_retrain,
    compose_config,
    mean_std,
    quoted,
    read_run_json,
    run_config,
    run_sweeps,
    same_config,
)
from benchmarks.rows import append_rows, read_rows  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402
from search_space.genotypes import GENOTYPES, Genotype, random_genotype  # noqa: E402
from search_space.ops import check_primitives  # noqa: E402

ARMS = ("searched", "random", "reference", "poor")
REFERENCES, POOR = ("DARTS_V2", "PC_DARTS"), "POOR_POOL_SKIP"
CELL_TYPES = ("normal", "reduce")
# BPTT at T = 4, ST-BIF trained as its quantized ANN, or that QANN at 4 levels with its binary SNN fine-tuned at T = 4
CIFAR10_EXPERIMENTS = ("cifar10_snn", "cifar10_qann", "cifar10_binary_snn")
CIFAR10_RETRAIN_BUDGET = {"epochs": 30, "layers": 8, "channels": 16}
# The named retrain budgets. proxy: the search's experiment on the supernet's size for 30 epochs. full: the
# full-size retrain, experiment=cifar10_qann_fast (20 x 36, 180 epochs), one process (GPU) per run, so at its
# recipe's global batch of 1,024 (its lr is for that batch), in fp16 (one GPU's fastest step; it learns like fp32,
# RESULTS.md "Accuracy against the anchors"); the searches stay experiment=cifar10_qann.
BUDGETS = ("proxy", "full")
FULL_TRAIN_EXPERIMENT, FULL_SEARCH_EXPERIMENT = "cifar10_qann_fast", "cifar10_qann"
FULL_TRAIN_OVERRIDES = ("batch_size=1024", "trainer.precision=fp16")


# ----------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Plan:
    """Everything every run gets: the overrides of each entry point and the seeds."""

    out: Path
    search_overrides: tuple[str, ...]
    train_overrides: tuple[str, ...]
    search_seeds: tuple[int, ...]
    random_seeds: tuple[int, ...]
    retrain_seeds: tuple[int, ...]
    device: str | None
    launcher: str = "basic"
    budget: str = "proxy"  # its name, recorded in the summary ("smoke" under --smoke)
    searches_from: Path | None = None  # another benchmark's DIR whose finished searches this one retrains
    judge: str = "test_acc"  # the judged quantity, a key of JUDGED
    warm_start: tuple[str, ...] = ()  # the judged retrain's overrides after a ReLU retrain of the cell (--warm-start)


# What the verdict compares: the retrained network's test accuracy, or its deployed binary SNN's after T steps
# (train.py's snn_finetune where it ran, else the converted SNN's; a QANN retrain is needed for these).
JUDGED = {"test_acc": "test accuracy", "snn_t4": "binary SNN accuracy at T = 4",
          "snn_t8": "binary SNN accuracy at T = 8"}


def judged_value(run: Mapping[str, Any], judge: str) -> float:
    """``run``'s judged quantity (a BenchmarkError when a SNN figure is missing: not a QANN retrain)."""
    if judge == "test_acc":
        return run["test_acc"]
    steps = judge.removeprefix("snn_t")
    value = (run.get("snn_acc_at_t") or {}).get(steps)
    if value is None:
        raise BenchmarkError(f"{run['run_dir']} has no binary SNN accuracy at T = {steps}: --judge {judge} needs QANN "
                             "retrains (experiment=cifar10_qann, or --train-override neuron=st_bif_qann)")
    return value


def make_plan(args: argparse.Namespace) -> Plan:
    common = check_overrides(args.overrides)
    search_only = check_overrides(args.search_override)
    train_only = check_overrides(args.train_override)
    device = (f"trainer.device={args.device}",) if args.device else ()
    full = args.budget == "full" and not args.smoke
    budget = {} if args.smoke or full else dict(CIFAR10_RETRAIN_BUDGET)
    flags = {"epochs": args.retrain_epochs, "layers": args.retrain_layers, "channels": args.retrain_channels}
    budget.update({key: value for key, value in flags.items() if value is not None})  # explicit flags win
    retrain_budget = tuple(f"{'epochs' if key == 'epochs' else f'model.network.{key}'}={value}"
                           for key, value in budget.items())
    if args.smoke:
        base_search = base_train = SMOKE
    elif full:
        base_search, base_train = (f"experiment={args.experiment}",), (f"experiment={FULL_TRAIN_EXPERIMENT}",
                                                                       *FULL_TRAIN_OVERRIDES)
    else:
        base_search = base_train = (f"experiment={args.experiment}",)
    return Plan(
        out=args.out.resolve(),
        search_overrides=(*base_search, *device, *common, *search_only),
        train_overrides=(*base_train, *retrain_budget, *device, *common, *train_only),
        search_seeds=tuple(range(args.searches)),
        random_seeds=tuple(range(args.randoms)),
        retrain_seeds=tuple(range(args.retrain_seeds)),
        device=args.device,
        launcher=args.launcher,
        budget="smoke" if args.smoke else args.budget,
        searches_from=args.searches_from.resolve() if args.searches_from else None,
        judge=args.judge,
        warm_start=warm_overrides(args, (*base_train, *retrain_budget, *device, *common, *train_only)),
    )


def warm_overrides(args: argparse.Namespace, train_overrides: Sequence[str]) -> tuple[str, ...]:
    """--warm-start's judged retrain: its epochs, LSQ thresholds, --warm-lr annealed without the recipe's warm-up
    (where its scheduler has one)."""
    if not args.warm_start:
        return ()
    scheduler = compose_config("train", (*train_overrides, "genotype=DARTS_V2"), args.launcher).optim.scheduler
    no_warmup = ("optim.scheduler.warmup_epochs=0",) if "warmup_epochs" in scheduler else ()
    return (f"epochs={args.warm_start}", "threshold_init=lsq", f"optim.optimizer.lr={args.warm_lr}", *no_warmup)


def search_sweep(plan: Plan) -> Sweep:
    """The searches: one multirun over the search seeds."""
    return Sweep(label="search", script="search.py", stage_dir=plan.out / "search", overrides=plan.search_overrides,
                 key="seed", values=tuple(map(str, plan.search_seeds)),
                 names=tuple(f"search_{seed}" for seed in plan.search_seeds), subdir="search_${seed}")


def retrain_sweeps(plan: Plan, sources: Sequence[str]) -> list[Sweep]:
    """The retrains of the cells DIR/genotypes/<source>.json: a multirun over the cells per retrain seed
    (its run dirs: retrain/<source>_seed<seed>, named by the resolver aso_se.stem from the genotype path). With
    --warm-start each starts from the ReLU retrain of its cell and seed (``relu_sweeps``)."""
    def warm(seed: int) -> tuple[str, ...]:
        if not plan.warm_start:
            return ()
        relu_run = quoted(f"{plan.out / 'retrain_relu'}/${{aso_se.stem:${{genotype}}}}_seed{seed}")
        return (f"init_from={relu_run}", *plan.warm_start)
    return _cell_sweeps(plan, sources, "retrain", "retrain", lambda seed: (f"seed={seed}", *warm(seed)))


def relu_sweeps(plan: Plan, sources: Sequence[str]) -> list[Sweep]:
    """--warm-start: the ReLU retrain of every cell (the same budget, ``neuron=relu``) in retrain_relu/, which the
    judged retrain then starts from; none without it."""
    if not plan.warm_start:
        return []
    return _cell_sweeps(plan, sources, "relu", "retrain_relu",
                        lambda seed: ("neuron=relu", "snn_finetune.epochs=0", f"seed={seed}"))


def _cell_sweeps(plan: Plan, sources: Sequence[str], label: str, stage: str, extra) -> list[Sweep]:
    """Per retrain seed, one multirun of train.py over the cells, with the plan's overrides then ``extra(seed)``."""
    paths = tuple(quoted(plan.out / "genotypes" / f"{source}.json") for source in sources)
    return [Sweep(label=f"{label}_seed{seed}", script="train.py", stage_dir=plan.out / stage,
                  overrides=(*plan.train_overrides, *extra(seed)), key="genotype", values=paths,
                  names=tuple(f"{source}_seed{seed}" for source in sources),
                  subdir=f"${{aso_se.stem:${{genotype}}}}_seed{seed}")
            for seed in plan.retrain_seeds]


def arm_of(source: str) -> str:
    if source.startswith("search_"):
        return "searched"
    if source.startswith("random_"):
        return "random"
    return "reference" if source in REFERENCES else {POOR: "poor"}[source]


# ----------------------------------------------------------------------------- the search space
@dataclass(frozen=True)
class SpaceRules:
    """What the search derives from: its primitives, cell shape and caps (skip_connect, parameter-free ops)."""

    primitives: tuple[str, ...]
    steps: int
    multiplier: int
    max_skip_connect: int | None
    config: dict[str, Any]  # the raw search_space and evolution's caps, to compare with each run's
    max_parameter_free: int | None = None
    max_normal_pools: int | None = None


def space_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a search config that the random cells must share."""
    evolution = cfg["search"]["evolution"]
    return {"search_space": dict(cfg["search_space"]), "max_skip_connect": evolution["max_skip_connect"],
            # caps absent in runs from before they existed
            "max_parameter_free": evolution.get("max_parameter_free"),
            "max_normal_pools": evolution.get("max_normal_pools")}


def search_space_rules(plan: Plan) -> SpaceRules:
    """The searches' search space, composed from the search overrides; also checks the retrain overrides."""
    from omegaconf import OmegaConf

    composed = compose_config("search", plan.search_overrides, plan.launcher)
    search_cfg = OmegaConf.to_container(composed.search_space, resolve=True)
    evolution = OmegaConf.to_container(composed.search.evolution, resolve=True)
    compose_config("train", (*plan.train_overrides, "genotype=DARTS_V2"), plan.launcher)
    config = space_config({"search_space": search_cfg, "search": {"evolution": evolution}})
    return SpaceRules(primitives=check_primitives(search_cfg["primitives"]), steps=int(search_cfg["steps"]),
                      multiplier=int(search_cfg["multiplier"]), max_skip_connect=evolution["max_skip_connect"],
                      config=config, max_parameter_free=evolution["max_parameter_free"],
                      max_normal_pools=evolution["max_normal_pools"])


def fixed_cells(plan: Plan, rules: SpaceRules) -> dict[str, dict[str, Genotype]]:
    """The cells known before any search: ``{arm: {source: genotype}}``."""
    randoms = {f"random_{seed}": random_genotype(rules.primitives, rules.steps, random.Random(seed),
                                                 rules.max_skip_connect, multiplier=rules.multiplier,
                                                 max_parameter_free=rules.max_parameter_free,
                                                 max_normal_pools=rules.max_normal_pools)
               for seed in plan.random_seeds}
    return {"random": randoms, "reference": {name: GENOTYPES[name] for name in REFERENCES},
            "poor": {POOR: GENOTYPES[POOR]}}


# ----------------------------------------------------------------------------- running
# ----------------------------------------------------------------------------- reading the runs
def alpha_entropy(supernet_state: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Mean per-edge entropy (nats) of softmax(α) over the unpruned ops: per cell type and over all edges."""
    per_edge = {}
    for kind in CELL_TYPES:
        alpha = _state_entry(supernet_state, f"arch.{kind}.alpha").double()
        mask = _state_entry(supernet_state, f"arch.{kind}.op_mask").bool()
        log_probs = torch.log_softmax(alpha.masked_fill(~mask, -math.inf), dim=-1)
        per_edge[kind] = -(log_probs.exp() * log_probs.masked_fill(~mask, 0.0)).sum(dim=-1)
    entropy = {kind: float(values.mean()) for kind, values in per_edge.items()}
    entropy["mean"] = float(torch.cat(list(per_edge.values())).mean())
    return entropy


def _state_entry(state: Mapping[str, torch.Tensor], suffix: str) -> torch.Tensor:
    matches = [key for key in state if key == suffix or key.endswith(f".{suffix}")]
    if len(matches) != 1:
        raise BenchmarkError(f"the search checkpoint has {len(matches)} entries named *{suffix}, expected 1")
    return state[matches[0]]


# Beside a finished search's genotype.json: what the benchmark reads of it, written on the first read. A run dir
# with its small files alone (no checkpoints/, e.g. copied to another machine) is then still read.
SEARCH_SUMMARY = "search_summary.json"


def collect_search(run_dir: Path, rules: SpaceRules) -> dict[str, Any]:
    """A finished search: its genotype, per-cycle genotypes, final α entropy and its minutes (wall and CPU, as the
    run measured them), from genotype.json and search_metrics.json (an older run's checkpoints/last.pt), or from
    SEARCH_SUMMARY once written."""
    genotype = Genotype.from_json(json.dumps(read_run_json(run_dir / "genotype.json")))
    if space_config(run_config(run_dir)) != rules.config:
        raise BenchmarkError(f"run {run_dir} searched another space than the random cells are drawn from "
                             f"({space_config(run_config(run_dir))} vs {rules.config}); its log is in {run_dir}")
    summary_path = run_dir / SEARCH_SUMMARY
    if summary_path.is_file():
        found = read_run_json(summary_path)
        if Genotype.from_json(json.dumps(found["genotype"])) != genotype:
            raise BenchmarkError(f"{summary_path} names another genotype than {run_dir / 'genotype.json'}: delete "
                                 f"{summary_path.name} to read the search's checkpoint again")
        return {**found, "run_dir": str(run_dir)}
    if (run_dir / "search_metrics.json").is_file():  # what the run wrote as it finished
        measured = read_run_json(run_dir / "search_metrics.json")
        if Genotype.from_json(json.dumps(measured["genotype"])) != genotype:
            raise BenchmarkError(f"{run_dir / 'search_metrics.json'} names another genotype than genotype.json: the "
                                 f"run dir holds two runs' files; search again into a new dir")
        entropy = measured["alpha_entropy"]
    else:  # a run from before search_metrics.json: its checkpoint
        measured = load_checkpoint(run_dir / "checkpoints" / "last.pt", kind="search")
        entropy = alpha_entropy(measured["engine"]["supernet"])
    cycles = sorted((run_dir / "genotypes").glob("cycle_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    found = {"seed": run_config(run_dir)["seed"], "genotype": json.loads(genotype.to_json()),
             "cycle_genotypes": [json.loads(path.read_text()) for path in cycles], "alpha_entropy": entropy,
             "wall_minutes": measured["wall_time_s"] / 60, "cpu_minutes": measured["cpu_time_s"] / 60}
    save_json(found, summary_path)
    return {**found, "run_dir": str(run_dir)}


def collect_arm_run(out: Path, run_dir: Path) -> dict[str, Any]:
    """A finished retrain of the benchmark in ``out``, once its metrics name the cell in genotypes/<source>.json: a
    cell file written again after its retrain (a search rerun, other seeds) would pair one cell with another's run."""
    source = run_dir.name.rsplit("_seed", 1)[0]
    run = collect_retrain(run_dir, source)
    cell_file = out / "genotypes" / f"{source}.json"
    if _genotype_of(run) != Genotype.from_json(json.dumps(read_run_json(cell_file))):
        raise BenchmarkError(f"{run_dir} trained another cell than {cell_file}; delete that run dir to retrain the "
                             "cell in the file, or put back the cell it trained")
    return run


def copy_searches(source: Path, run_dirs: Sequence[Path]) -> None:
    """``--searches-from``: the finished searches of another benchmark (their small files) into this one's run dirs,
    where the search multirun finds them finished; so both benchmarks retrain the same searched cells."""
    for run_dir in run_dirs:
        found = source / "search" / run_dir.name
        if not (found / "genotype.json").is_file() or not (found / SEARCH_SUMMARY).is_file():
            raise UserInputError(f"--searches-from {source}: {found} is not a finished search read by that "
                                 f"benchmark (genotype.json and {SEARCH_SUMMARY}); finish it there with --resume, "
                                 "or ask for fewer --searches")
        if not run_dir.exists():
            shutil.copytree(found, run_dir, ignore=shutil.ignore_patterns("checkpoints", "tb"))


def retrain_budget(plan: Plan, run_dirs: Sequence[Path]) -> dict[str, Any]:
    """What every retrain got, read back from each run's composed config; they must be identical."""
    first = same_config(run_dirs, ignore=("genotype", "seed", "init_from"))
    return {"name": plan.budget, "search_overrides": list(plan.search_overrides),
            "train_overrides": list(plan.train_overrides),
            "search_seeds": list(plan.search_seeds), "random_seeds": list(plan.random_seeds),
            "retrain_seeds": list(plan.retrain_seeds), "warm_start": list(plan.warm_start),
            "device": plan.device or "auto (CUDA when present)",
            "launcher": plan.launcher, "searches_from": str(plan.searches_from) if plan.searches_from else None,
            "epochs": first["epochs"], "data": first["data"], "neuron": first["neuron"],
            "network": first["model"]["network"], "batch_size": first["batch_size"], "retrain_config": first}


# ----------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class ArmStats:
    """Test accuracy of an arm's runs: count, mean, sample std (None below 2 runs); params and firing means; a QANN's
    SNN accuracy and the energy per image, means (None where a run has none)."""

    n: int
    mean: float
    std: float | None
    params_m: float
    firing_rate: float | None
    snn_acc: float | None = None
    energy_uj: float | None = None


def _mean_of_all(runs: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [run.get(key) for run in runs]
    return None if not values or None in values else statistics.fmean(values)


def _sum_of_all(runs: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [run.get(key) for run in runs]
    return None if None in values else sum(values)


def arm_stats(runs: Sequence[Mapping[str, Any]], judge: str = "test_acc") -> ArmStats:
    """``mean`` and ``std`` are those of the judged quantity (``JUDGED``)."""
    mean, std = mean_std([judged_value(run, judge) for run in runs])
    return ArmStats(n=len(runs), mean=mean, std=std, params_m=statistics.fmean(run["params_m"] for run in runs),
                    firing_rate=_mean_of_all(runs, "firing_rate_mean"), snn_acc=_mean_of_all(runs, "snn_test_acc"),
                    energy_uj=_mean_of_all(runs, "energy_per_image_uj"))


@dataclass(frozen=True)
class Verdict:
    searched_beats_random: bool | None  # searched mean >= random mean + 1 random std; None: undecided
    poor_below_random: bool | None  # poor mean < random mean - 1 random std
    searched_beats_darts_v2: bool | None = None  # searched mean >= DARTS_V2's mean; None: no DARTS_V2 run
    lines: tuple[str, ...] = field(default=())


def verdict(stats: Mapping[str, ArmStats], darts_v2: float | None = None, judged: str = JUDGED["test_acc"]) -> Verdict:
    """The issue's questions on the ``judged`` quantity: against the random arm's spread (undecided below 2 random
    runs), and against DARTS_V2's mean ``darts_v2`` (undecided without it)."""
    searched = stats["searched"].mean
    beats_published = None if darts_v2 is None else searched >= darts_v2
    published_line = ("searched >= DARTS_V2? undecided: no DARTS_V2 run" if darts_v2 is None else
                      f"searched >= DARTS_V2? {'YES' if beats_published else 'NO'} ({searched:.4f} vs {darts_v2:.4f})")
    rand = stats["random"]
    if rand.std is None:
        note = f"undecided: the random arm has {rand.n} run(s), its std needs 2 or more"
        return Verdict(None, None, beats_published,
                       (f"searched >= random + 1 std? {note}", f"poor < random - 1 std? {note}", published_line))
    beats = searched >= rand.mean + rand.std
    poor = stats.get("poor")  # absent only in a progress report
    below = None if poor is None else poor.mean < rand.mean - rand.std
    poor_line = ("poor < random - 1 std? undecided: no poor run" if poor is None else
                 f"poor < random - 1 std? {'YES' if below else 'NO'} ({poor.mean:.4f} vs {rand.mean:.4f} - "
                 f"{rand.std:.4f})")
    return Verdict(beats, below, beats_published, (
        f"searched >= random + 1 std? {'YES' if beats else 'NO'} ({searched:.4f} vs {rand.mean:.4f} + {rand.std:.4f}; "
        f"{judged})", poor_line, published_line,
    ))


def searched_needs(searched: Sequence[float], missing: int, bars: Mapping[str, float | None]) -> dict[str, float]:
    """What the ``missing`` searched retrains must average for the mean over all of them to reach each bar (a
    candidate change's stopping rule); {} when none is missing."""
    if missing < 1:
        return {}
    total = len(searched) + missing
    return {name: (total * bar - sum(searched)) / missing for name, bar in bars.items() if bar is not None}


def table(stats: Mapping[str, ArmStats]) -> str:
    """The markdown table: arm, n, test accuracy mean ± std, params, firing rate, SNN accuracy, energy per image."""
    rows = ["| arm | n | test acc (mean ± std) | params (M) | firing rate | SNN acc | energy (µJ / image) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for arm, s in stats.items():
        std = "n/a" if s.std is None else f"{s.std:.4f}"
        firing, snn = ("n/a" if value is None else f"{value:.4f}" for value in (s.firing_rate, s.snn_acc))
        energy = "n/a" if s.energy_uj is None else f"{s.energy_uj:,.0f}"
        rows.append(f"| {arm} | {s.n} | {s.mean:.4f} ± {std} | {s.params_m:.4f} | {firing} | {snn} | {energy} |")
    return "\n".join(rows)


def plot(arms: Mapping[str, Sequence[Mapping[str, Any]]], stats: Mapping[str, ArmStats], path: Path,
         judge: str = "test_acc") -> None:
    """The judged quantity per arm: every run as a point, and the arm's mean ± std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for x, (arm, runs) in enumerate(arms.items()):
        accuracies = [judged_value(run, judge) for run in runs]
        offsets = [0.0] if len(runs) == 1 else [-0.15 + 0.3 * i / (len(runs) - 1) for i in range(len(runs))]
        axes.scatter([x + 0.2 + offset * 0.5 for offset in offsets], accuracies, s=18, alpha=0.7)
        axes.errorbar(x - 0.1, stats[arm].mean, yerr=stats[arm].std or 0.0, fmt="o", color="black", capsize=5)
    axes.set_xticks(range(len(arms)), [f"{arm}\n(n={stats[arm].n})" for arm in arms])
    axes.set_ylabel(JUDGED[judge])
    axes.set_title("retrained cells: runs (colour) and mean ± std (black)")
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def pareto_plot(arms: Mapping[str, Sequence[Mapping[str, Any]]], path: Path, steps: int = 8) -> bool:
    """The binary SNN's accuracy after ``steps`` steps against its energy per image, a point per run, a marker per
    arm (the published cell named); False (nothing drawn) when a run lacks either figure (not a QANN retrain)."""
    points = {arm: [((run.get("snn_acc_at_t") or {}).get(str(steps)), run.get("snn_energy_uj"), run["source"])
                    for run in runs] for arm, runs in arms.items()}
    if not any(points.values()) or any(None in point[:2] for runs in points.values() for point in runs):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for (arm, runs), marker in zip(points.items(), "osD^v"):
        if runs:
            axes.scatter([energy for _, energy, _ in runs], [accuracy for accuracy, _, _ in runs], marker=marker,
                         s=28, alpha=0.8, label=arm)
        for accuracy, energy, source in runs:
            if source == "DARTS_V2":
                axes.annotate(source, (energy, accuracy), fontsize=7, xytext=(4, 4), textcoords="offset points")
    axes.set_xlabel("SNN energy per image (µJ)")
    axes.set_ylabel(f"binary SNN accuracy at T = {steps}")
    axes.set_title("accuracy against energy: up and left is better")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def genotype_distance(a: Genotype, b: Genotype) -> dict[str, int]:
    """Edges of ``a`` not in ``b``, per cell type: each node's two (op, input) edges compared as a multiset (the
    order within a node carries no meaning)."""
    distance = {}
    for kind in CELL_TYPES:
        edges_a, edges_b = getattr(a, kind), getattr(b, kind)
        if len(edges_a) != len(edges_b):
            raise BenchmarkError(f"the {kind} cells have {len(edges_a)} and {len(edges_b)} edges; compare cells "
                                 "of one search space")
        differing = 0
        for node in range(0, len(edges_a), 2):
            left, right = list(edges_a[node:node + 2]), list(edges_b[node:node + 2])
            for edge in left:
                if edge in right:
                    right.remove(edge)
                else:
                    differing += 1
        distance[kind] = differing
    return distance


def search_spread(cells: Sequence[Genotype], searched: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How far apart the searches landed: pairwise genotype distance of their cells (mean and max per cell type, out
    of its edges; None below 2 cells, trained or not) and the std of the searched runs' per-cell mean accuracies."""
    by_source: dict[str, list[Mapping[str, Any]]] = {}
    for run in searched:
        by_source.setdefault(run["source"], []).append(run)
    pairs = [genotype_distance(a, b) for i, a in enumerate(cells) for b in cells[i + 1:]]
    spread: dict[str, Any] = {"cells": len(cells), "pairs": len(pairs)}
    for kind in CELL_TYPES:
        values = [pair[kind] for pair in pairs]
        spread[kind] = {"edges": len(getattr(cells[0], kind)) if cells else None,
                        "mean": statistics.fmean(values) if values else None, "max": max(values, default=None)}
    means = [statistics.fmean(run["test_acc"] for run in runs) for runs in by_source.values()]
    spread["acc_std"] = mean_std(means)[1] if means else None
    return spread


def _genotype_of(run: Mapping[str, Any]) -> Genotype:
    return Genotype.from_json(json.dumps(run["genotype"]))


def spread_line(spread: Mapping[str, Any]) -> str:
    if spread["pairs"] == 0:
        return f"Searches' spread: {spread['cells']} searched cell(s), no pair to compare."
    kinds = ", ".join(f"{kind} mean {spread[kind]['mean']:.2f} / max {spread[kind]['max']} of {spread[kind]['edges']}"
                      for kind in CELL_TYPES)
    std = "n/a" if spread["acc_std"] is None else f"{spread['acc_std']:.4f}"
    return (f"Searches' spread over {spread['pairs']} pair(s) of {spread['cells']} cells: differing edges {kinds}; "
            f"test acc std {std}.")


# ----------------------------------------------------------------------------- the full budget's ranking
# The full budget's arms: the result rows of case "full/<arm>" (a --budget full benchmark's rows, accuracy.py's default
# label), their cells the files in results/genotypes/ (that benchmark's searched and random cells) or bundled ones.
RESULTS_DIR = REPO / "benchmarks" / "results"
FULL_LABEL = "full"
MIN_CELLS_FOR_TAU = 3  # with two cells τ is ±1 whatever the budgets: no evidence
ROW_CELL = re.compile(r"^(?P<source>\w+?)(?:_seed\d+)?(?:[,:\s]|$)")  # a row's note names its cell first


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> tuple[float | None, float | None]:
    """Kendall's τ-b between two rankings and its two-sided p-value: scipy.stats.kendalltau's where scipy is
    installed, else :func:`kendall_tau_b` and no p-value; τ None where a ranking is all ties (undefined)."""
    try:
        from scipy.stats import kendalltau
    except ImportError:
        return kendall_tau_b(x, y), None
    result = kendalltau(x, y)
    tau, p = float(result.statistic), float(result.pvalue)
    return (None, None) if math.isnan(tau) else (tau, None if math.isnan(p) else p)


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's τ-b, ties counted as scipy.stats.kendalltau counts them; None when a ranking is all ties. O(n²): a
    benchmark has a handful of cells."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b needs two sequences of one length, got {len(x)} and {len(y)}")
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue  # tied in both: in neither ranking's count of untied pairs
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return None if denominator == 0 else (concordant - discordant) / denominator


def cell_genotype(source: str, genotypes_dir: Path) -> Genotype | None:
    """The cell a full-budget row names: a bundled genotype, or its file in ``genotypes_dir``; None if neither."""
    if source in GENOTYPES:
        return GENOTYPES[source]
    path = genotypes_dir / f"{source}.json"
    return Genotype.from_json(path.read_text()) if path.is_file() else None


def cells_of_rows(rows: Sequence[Mapping[str, str]], label: str,
                  genotypes_dir: Path) -> dict[str, tuple[str, list[float]]]:
    """The test accuracies of the rows of case ``label/<arm>``, by cell: ``{genotype JSON: (source, accuracies)}``; a
    row whose cell has no genotype (no file, not bundled) is left out."""
    cells: dict[str, tuple[str, list[float]]] = {}
    for row in rows:
        found = ROW_CELL.match(row["note"])
        if row["case"].rsplit("/", 1)[0] != label or row["metric"] != "test accuracy" or found is None:
            continue
        genotype = cell_genotype(found["source"], genotypes_dir)
        if genotype is not None:
            cells.setdefault(genotype.to_json(), (found["source"], []))[1].append(float(row["value"]))
    return cells


def full_budget_cells(results: Path = RESULTS_DIR) -> dict[str, tuple[str, list[float]]]:
    """The full budget's arms in ``results``' search_vs_random.csv (:func:`cells_of_rows`); none without the file."""
    path = results / "search_vs_random.csv"
    return cells_of_rows(read_rows(path), FULL_LABEL, results / "genotypes") if path.is_file() else {}


def rank_agreement(short: Mapping[str, tuple[str, Sequence[float]]],
                   full: Mapping[str, tuple[str, Sequence[float]]]) -> dict[str, Any]:
    """Kendall's τ-b between the mean test accuracies of the cells both budgets retrained (``{genotype JSON: (source,
    accuracies)}`` each); τ None below MIN_CELLS_FOR_TAU cells in common or where a ranking is all ties."""
    common = [key for key in short if key in full]
    pairs = [{"cell": short[key][0], "short": statistics.fmean(short[key][1]), "full": statistics.fmean(full[key][1])}
             for key in common]
    tau = p = None
    if len(pairs) >= MIN_CELLS_FOR_TAU:
        tau, p = kendall_tau([pair["short"] for pair in pairs], [pair["full"] for pair in pairs])
    return {"tau": tau, "p": p, "cells": pairs, "full_rows": f"results/search_vs_random.csv, case {FULL_LABEL}/<arm>"}


def rank_agreement_line(agreement: Mapping[str, Any]) -> str:
    cells = agreement["cells"]
    names = ", ".join(pair["cell"] for pair in cells) or "none"
    if agreement["tau"] is None:
        why = (f"{len(cells)} cell(s) in common ({names}), it needs {MIN_CELLS_FOR_TAU}"
               if len(cells) < MIN_CELLS_FOR_TAU else f"a ranking of the {len(cells)} cells in common is all ties")
        return f"Kendall τ-b against the full budget: not defined ({why}); no row."
    p = "" if agreement["p"] is None else f"; p = {agreement['p']:.2f}"
    return (f"Kendall τ-b against the full budget ({agreement['full_rows']}): {agreement['tau']:.3f} over "
            f"{len(cells)} cells in common ({names}){p}.")


def short_budget_cells(rows: Sequence[Mapping[str, str]], label: str,
                       genotypes_dir: Path) -> dict[str, tuple[str, list[float]]]:
    """A short budget's arms from its rows (case ``label/<arm>``), for a benchmark that retrained the full benchmark's
    cells (--searches-from): only then are its searched cells the files in ``genotypes_dir``."""
    rows = [row for row in rows if row["case"].rsplit("/", 1)[0] == label]
    if not rows:
        raise UserInputError(f"no row of case {label}/<arm> in results/search_vs_random.csv; pass the label of "
                             "a benchmark's rows (the part of their case before the last '/')")
    if not all("--searches-from" in row["command"] for row in rows if row["metric"] == "test accuracy"):
        raise UserInputError(f"the rows of case {label}/<arm> did not retrain the full benchmark's cells "
                             "(--searches-from), so their searched cells are not in results/genotypes/; their τ is "
                             "the one their benchmark printed (summary.json's rank_agreement)")
    return cells_of_rows(rows, label, genotypes_dir)


def rank_rows(label: str, rows_out: str | None, results: Path = RESULTS_DIR) -> int:
    """--rank-rows: τ between the rows of case ``label`` and the full budget's, printed, and appended as a row when it
    is defined (to ``rows_out``; '' writes none)."""
    agreement = rank_agreement(short_budget_cells(read_rows(results / "search_vs_random.csv"), label,
                                                  results / "genotypes"), full_budget_cells(results))
    print(rank_agreement_line(agreement))
    for pair in agreement["cells"]:
        print(f"| {pair['cell']} | {pair['short']:.2f} | {pair['full']:.2f} |")
    target = results / "search_vs_random.csv" if rows_out is None else rows_out
    row = ranking_row(agreement, label)
    if row is not None and target:
        append_rows(Path(target), [row])
        print(f"1 row appended to {target}")
    return 0


# ----------------------------------------------------------------------------- the benchmark
def minutes_per_arm(searches: Sequence[Mapping[str, Any]],
                    arms: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Wall minutes (device minutes when the runs use a GPU) and process CPU minutes, searches apart."""
    minutes = {}
    for arm, runs in arms.items():
        minutes[arm] = {"retrain_wall": sum(run["wall_minutes"] for run in runs),
                        "retrain_cpu": _sum_of_all(runs, "cpu_minutes"),
                        "devices": sorted({str(run["device"]) for run in runs})}
    minutes["searched"].update(search_wall=sum(s["wall_minutes"] for s in searches),
                               search_cpu=sum(s["cpu_minutes"] for s in searches))
    return minutes


def cells_of_summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, list[float]]]:
    """This benchmark's retrains by cell, as :func:`rank_agreement` takes them (test accuracy in %, as rows hold it)."""
    cells: dict[str, tuple[str, list[float]]] = {}
    for run in runs:
        cells.setdefault(_genotype_of(run).to_json(), (run["source"], []))[1].append(100 * run["test_acc"])
    return cells


def by_arm(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    return {arm: [run for run in runs if arm_of(run["source"]) == arm] for arm in ARMS}


def darts_v2_mean(arms: Mapping[str, Sequence[Mapping[str, Any]]], judge: str = "test_acc") -> float | None:
    """DARTS_V2's mean judged quantity over its retrains (None: none finished), the verdict's published bar."""
    accuracies = [judged_value(run, judge) for run in arms["reference"] if run["source"] == "DARTS_V2"]
    return statistics.fmean(accuracies) if accuracies else None


def write_fixed_cells(plan: Plan, rules: SpaceRules) -> list[str]:
    """Writes the cells known before any search to DIR/genotypes/ and returns their names. A cell already there must
    be the one these flags draw: a benchmark's registered random cells are never replaced."""
    cells = {plan.out / "genotypes" / f"{source}.json": json.loads(genotype.to_json())
             for arm in fixed_cells(plan, rules).values() for source, genotype in arm.items()}
    for path, cell in cells.items():  # all checked before any is written
        if path.is_file() and json.loads(path.read_text()) != cell:
            raise UserInputError(f"{path} holds another cell than these flags draw; pass the flags the benchmark "
                                 "was started with, or a new --out")
    for path, cell in cells.items():
        save_json(cell, path)
    return [path.stem for path in cells]


def run_benchmark(plan: Plan, resume: bool = False, searches_only: bool = False) -> dict[str, Any] | None:
    """Runs the searches, then the retrains of every cell, and returns the summary (also written to plan.out).
    ``searches_only``: stops once every cell's genotype is in DIR/genotypes/ (None; --resume goes on later)."""
    rules = search_space_rules(plan)
    sources = write_fixed_cells(plan, rules)
    search = search_sweep(plan)
    if plan.searches_from is not None:
        copy_searches(plan.searches_from, search.run_dirs())
    search_dirs = run_sweeps([search], plan.launcher, resume or plan.searches_from is not None, plan.out / "logs")
    searches = [collect_search(run_dir, rules) for run_dir in search_dirs]
    for name, found in zip(search.names, searches):  # the found cells beside the others: one retrain multirun
        save_json(found["genotype"], plan.out / "genotypes" / f"{name}.json")
    sources = [*search.names, *sources]
    if searches_only:
        return None
    run_sweeps(relu_sweeps(plan, sources), plan.launcher, resume, plan.out / "logs")  # --warm-start's first stage
    retrain_dirs = run_sweeps(retrain_sweeps(plan, sources), plan.launcher, resume, plan.out / "logs")
    runs = [collect_arm_run(plan.out, run_dir) for run_dir in sorted(retrain_dirs)]
    arms = by_arm(runs)
    stats = {arm: arm_stats(runs, plan.judge) for arm, runs in arms.items()}
    decision = verdict(stats, darts_v2_mean(arms, plan.judge), JUDGED[plan.judge])
    # this budget's ranking against the full budget's rows of the same cells (none for a full benchmark itself)
    agreement = None if plan.budget == "full" else rank_agreement(cells_of_summary(runs), full_budget_cells())
    by_source = dict(zip(search.names, searches))
    for run in arms["searched"]:
        run["alpha_entropy"] = by_source[run["source"]]["alpha_entropy"]["mean"]
    summary = {
        **arms,
        "budget": {**retrain_budget(plan, retrain_dirs), "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "searches": searches,
        "search_space": {"primitives": list(rules.primitives), "steps": rules.steps,
                         "multiplier": rules.multiplier, "max_skip_connect": rules.max_skip_connect,
                         "max_parameter_free": rules.max_parameter_free,
                         "max_normal_pools": rules.max_normal_pools},
        "minutes": minutes_per_arm(searches, arms),
        "stats": {arm: vars(s) for arm, s in stats.items()},
        "search_spread": search_spread([_genotype_of(found) for found in searches], arms["searched"]),
        "rank_agreement": agreement,
        "verdict": {"searched_beats_random": decision.searched_beats_random,
                    "poor_below_random": decision.poor_below_random,
                    "searched_beats_darts_v2": decision.searched_beats_darts_v2, "lines": list(decision.lines)},
    }
    save_json(summary, plan.out / "summary.json")
    (plan.out / "summary.md").write_text(summary_markdown(summary, stats, decision))
    plot(arms, stats, plan.out / "summary.png", plan.judge)
    pareto_plot(arms, plan.out / "pareto.png")  # QANN retrains: accuracy at T = 8 against energy
    return summary


def report_progress(plan: Plan) -> dict[str, Any]:
    """What has finished in plan.out so far, running nothing: every finished retrain by arm, the runs still missing
    (and where those with a train.log stand), the arms' statistics and the verdict on what there is (written to
    DIR/progress.json and progress.md)."""
    rules = search_space_rules(plan)
    sources = [*search_sweep(plan).names, *(source for cells in fixed_cells(plan, rules).values() for source in cells)]
    runs, missing, in_training = [], [], {}
    for sweep in retrain_sweeps(plan, sources):
        for name, run_dir in zip(sweep.names, sweep.run_dirs()):
            if (run_dir / "metrics.json").is_file():
                runs.append(collect_arm_run(plan.out, run_dir))
            else:
                missing.append(name)
                if logged := last_logged_epoch(run_dir):
                    in_training[name] = logged
    arms = by_arm(runs)
    stats = {arm: arm_stats(arm_runs, plan.judge) for arm, arm_runs in arms.items() if arm_runs}
    # the finished runs got one budget (a BenchmarkError names the first difference otherwise)
    config = (same_config([Path(run["run_dir"]) for run in runs], ignore=("genotype", "seed", "init_from"))
              if runs else None)
    budget = None if config is None else {"epochs": config["epochs"], "network": config["model"]["network"],
                                          "batch_size": config["batch_size"]}
    found = [plan.out / "genotypes" / f"{name}.json" for name in search_sweep(plan).names]
    spread = search_spread([Genotype.from_json(path.read_text()) for path in found if path.is_file()],
                           arms["searched"])
    absent = [arm for arm in ("searched", "random") if arm not in stats]
    lines = (f"no verdict yet: no finished run in {' or '.join(absent)}",) if absent else \
        verdict(stats, darts_v2_mean(arms, plan.judge), JUDGED[plan.judge]).lines
    searched_missing = [name for name in missing
                        if any(name.startswith(f"{search}_seed") for search in search_sweep(plan).names)]
    rand = stats.get("random")
    needs = searched_needs([judged_value(run, plan.judge) for run in arms["searched"]], len(searched_missing), {
        "DARTS_V2": darts_v2_mean(arms, plan.judge),
        "random + 1 std": None if rand is None or rand.std is None else rand.mean + rand.std})
    if needs:
        reach = ", ".join(f"{need:.4f} ({bar})" for bar, need in needs.items())
        which = "it" if len(needs) == 1 else "each"
        lines = (*lines, f"still needed: the {len(searched_missing)} missing searched retrain(s) must average {reach} "
                 f"for the searched mean to reach {which}")
    searching = {name: logged for name in search_sweep(plan).names
                 if not (plan.out / "genotypes" / f"{name}.json").is_file()
                 and (logged := last_search_epoch(plan.out / "search" / name))}
    progress = {**arms, "missing": missing, "in_training": in_training, "searching": searching, "budget": budget,
                "stats": {arm: vars(s) for arm, s in stats.items()},
                "search_spread": spread, "verdict_so_far": list(lines), "searched_needs": needs}
    shown = "" if budget is None else (f" Budget: {budget['epochs']} epochs, {budget['network']['layers']} cells of "
                                       f"{budget['network']['channels']} channels, batch {budget['batch_size']}.")
    save_json(progress, plan.out / "progress.json")
    (plan.out / "progress.md").write_text("\n".join([
        "# Searched vs random cells: progress", "", f"Finished retrains: {len(runs)}; still missing: "
        f"{', '.join(missing) or 'none'}.{shown}",
        *filter(None, [searching_line(searching), training_line(in_training), pending_line(runs)]),
        spread_line(spread), "",
        table(stats), "",
        *[f"- so far: {line}" for line in lines], ""]))
    return progress


RETRAIN_EPOCH_LINE = re.compile(r"retrain epoch (?P<epoch>\d+)/(?P<epochs>\d+) \| (?P<scalars>.*)$")


def last_logged_epoch(run_dir: Path) -> dict[str, Any] | None:
    """An unfinished retrain's last epoch in its train.log (still training, or stopped to be resumed); None if none."""
    log = run_dir / "train.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    logged = [found for line in lines if (found := RETRAIN_EPOCH_LINE.search(line))]
    if not logged:
        return None
    last = max(logged, key=lambda found: int(found["epoch"]))  # a resumed piece logs on from its checkpoint
    words = last["scalars"].split()
    test_acc = dict(zip(words[::2], words[1::2])).get("test_acc")
    return {"epoch": int(last["epoch"]), "epochs": int(last["epochs"]),
            "test_acc": None if test_acc is None else float(test_acc)}


SEARCH_EPOCH_LINE = re.compile(r"cycle (\d+) (\w+) \(epoch (\d+)\)")


def last_search_epoch(run_dir: Path) -> dict[str, Any] | None:
    """An unfinished search's last logged epoch (its search.log) of the schedule's total (its .hydra config); None if
    it logged none."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    log, config = run_dir / "search.log", run_dir / ".hydra" / "config.yaml"
    matches = SEARCH_EPOCH_LINE.findall(log.read_text()) if log.is_file() and config.is_file() else []
    if not matches:
        return None
    cycle, phase, epoch = matches[-1]
    schedule = instantiate(OmegaConf.load(config).search.schedule)
    return {"epoch": int(epoch), "epochs": schedule.total_epochs, "cycle": int(cycle), "phase": phase}


def searching_line(searching: Mapping[str, Mapping[str, Any]]) -> str:
    """The searches without a cell yet: where each stands (a search stopped to be resumed)."""
    stands = [f"{name} at epoch {logged['epoch']}/{logged['epochs']} (cycle {logged['cycle']}, {logged['phase']})"
              for name, logged in searching.items()]
    return f"Searching (last logged epoch): {'; '.join(stands)}." if stands else ""


def training_line(in_training: Mapping[str, Mapping[str, Any]]) -> str:
    """The unfinished retrains' last logged epochs: where a long protocol's arms stand while they train or wait."""
    stands = [f"{name} at epoch {logged['epoch']}/{logged['epochs']}"
              + ("" if logged["test_acc"] is None else f", test acc {logged['test_acc']:.4f}")
              for name, logged in in_training.items()]
    return f"In training (last logged epoch): {'; '.join(stands)}." if stands else ""


def pending_line(runs: Sequence[Mapping[str, Any]]) -> str:
    """The runs whose metrics.json lacks evaluations (the run stopped before them): which, and why."""
    incomplete = [f"{Path(run['run_dir']).name} ({', '.join(run['pending'])}"
                  + (f"; figures rebuilt from its {run['recovered_from']}" if run.get("recovered_from") else "") + ")"
                  for run in runs if run.get("pending")]
    return f"Evaluations pending: {'; '.join(incomplete)}." if incomplete else ""


def _minutes(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"  # CPU minutes: a run rebuilt from its log has none


def summary_markdown(summary: Mapping[str, Any], stats: Mapping[str, ArmStats], decision: Verdict) -> str:
    budget = summary["budget"]
    entropies = ", ".join(f"{s['alpha_entropy']['mean']:.3f}" for s in summary["searches"])
    return "\n".join([
        "# Searched vs random cells", "",
        f"Retrain budget **{budget['name']}** (every arm): `{' '.join(budget['train_overrides'])}`, "
        f"seeds {budget['retrain_seeds']}, "
        f"{budget['epochs']} epochs, {budget['network']['layers']} cells of {budget['network']['channels']} channels.",
        f"Searches: `{' '.join(budget['search_overrides'])}`, seeds {budget['search_seeds']}; "
        f"final α mean edge entropy (nats): {entropies}.", spread_line(summary["search_spread"]),
        *([rank_agreement_line(summary["rank_agreement"])] if summary.get("rank_agreement") else []),
        *filter(None, [pending_line([run for arm in ARMS for run in summary.get(arm, [])])]), "",
        table(stats), "", *[f"- {line}" for line in decision.lines], "",
        "Minutes per arm (wall, i.e. device time on a GPU / process CPU):",
        *[f"- {arm}: retrain {m['retrain_wall']:.1f} / {_minutes(m['retrain_cpu'])}"
          + (f", search {m['search_wall']:.1f} / {m['search_cpu']:.1f}" if "search_wall" in m else "")
          for arm, m in summary["minutes"].items()], "",
    ])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="a new or empty directory: every run and the summary (required but for --rank-rows)")
    parser.add_argument("--smoke", action="store_true", help="experiment=smoke for every run: seconds each on a CPU")
    parser.add_argument("--budget", default="proxy", choices=BUDGETS,
                        help="the retrain budget: proxy (8 cells x 16 channels, 30 epochs; default) or full "
                             f"(experiment={FULL_TRAIN_EXPERIMENT}: 20 x 36, 180 epochs, fp16; "
                             f"searches {FULL_SEARCH_EXPERIMENT})")
    parser.add_argument("--experiment", default=None, choices=CIFAR10_EXPERIMENTS,
                        help="the CIFAR-10 experiment of every run: cifar10_snn (BPTT, T = 4; default) or "
                             f"cifar10_qann (--budget full: {FULL_SEARCH_EXPERIMENT}, the only one it takes)")
    parser.add_argument("--searches", type=int, default=None, help="searches (seeds 0..S-1); default 3, smoke 2")
    parser.add_argument("--randoms", type=int, default=None, help="random cells (seeds 0..R-1); default 5, smoke 2")
    parser.add_argument("--retrain-seeds", type=int, default=1, help="retrains of every cell (seeds 0..N-1)")
    parser.add_argument("--searches-only", action="store_true",
                        help="stop once the searches ran and every cell is in DIR/genotypes/; --resume (without this "
                             "flag) retrains them later, skipping retrain run dirs that hold their metrics.json")
    parser.add_argument("--cells-only", action="store_true",
                        help="run nothing: write the cells known before any search (random, references, floor) to "
                             "DIR/genotypes/, e.g. to register a change's random cells before its searches")
    parser.add_argument("--progress", action="store_true",
                        help="run nothing: report DIR's finished retrains, the missing ones and the verdict so far "
                             "(DIR/progress.json, progress.md)")
    parser.add_argument("--searches-from", type=Path, default=None, metavar="DIR",
                        help="retrain the finished searches of the benchmark in DIR instead of searching (the same "
                             "seeds), e.g. a --budget full benchmark's cells at a proxy budget")
    parser.add_argument("--retrain-epochs", type=int, default=None,
                        help="default: the budget's (proxy 30, full 180; smoke: experiment=smoke's)")
    parser.add_argument("--retrain-layers", type=int, default=None,
                        help="cells of the retrained network; default: the budget's (proxy 8, full 20)")
    parser.add_argument("--retrain-channels", type=int, default=None,
                        help="its base channels; default: the budget's (proxy 16, full 36)")
    parser.add_argument("--device", default=None, help="trainer.device of every run (cpu, cuda, cuda:1); default: auto")
    parser.add_argument("--judge", default="test_acc", choices=sorted(JUDGED),
                        help="the quantity the verdict compares: test_acc (default) or the deployed binary SNN's "
                             "accuracy at T = 4 / 8 (snn_t4, snn_t8; QANN retrains)")
    parser.add_argument("--warm-start", type=int, default=None, metavar="EPOCHS",
                        help="retrain every cell as ReLU first (the same budget, in DIR/retrain_relu/), then the "
                             "judged retrain for EPOCHS epochs from its weights with LSQ thresholds (init_from, "
                             "threshold_init=lsq; the route that keeps a few-level QANN's accuracy)")
    parser.add_argument("--warm-lr", type=float, default=0.02,
                        help="--warm-start: the judged retrain's learning rate, annealed without warm-up (default "
                             "0.02, measured at batch 256)")
    parser.add_argument("--search-override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override for the searches only (repeatable)")
    parser.add_argument("--train-override", action="append", default=[], metavar="KEY=VALUE",
                        help="a Hydra override for the retrains only (repeatable)")
    parser.add_argument("--rank-rows", default=None, metavar="LABEL",
                        help="run nothing: Kendall τ-b between the rows of case LABEL/<arm> in "
                             "results/search_vs_random.csv (a benchmark run with --searches-from the full one) and the "
                             "full budget's rows of the same cells, appended as a row when defined")
    parser.add_argument("--rows-out", default=None, help="--rank-rows: the rows file (default: results/"
                                                         "search_vs_random.csv; '' writes none)")
    add_launcher_args(parser)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. data.root=... neuron=lif")
    args = parser.parse_args(argv)
    check_launcher_args(parser, args)
    if args.out is None and args.rank_rows is None:
        parser.error("the following arguments are required: --out")
    if args.budget == "full" and args.smoke:
        parser.error("--smoke is its own budget (experiment=smoke); drop --budget full")
    if args.budget == "full" and args.experiment not in (None, FULL_SEARCH_EXPERIMENT):
        parser.error(f"--budget full retrains experiment={FULL_TRAIN_EXPERIMENT}, whose searches are "
                     f"{FULL_SEARCH_EXPERIMENT}; drop --experiment {args.experiment}")
    if args.experiment is None:
        args.experiment = FULL_SEARCH_EXPERIMENT if args.budget == "full" else "cifar10_snn"
    args.searches = (2 if args.smoke else 3) if args.searches is None else args.searches
    args.randoms = (2 if args.smoke else 5) if args.randoms is None else args.randoms
    if args.warm_start is not None and args.warm_start < 1:
        parser.error("--warm-start must be at least 1 epoch")
    for name in ("searches", "randoms", "retrain_seeds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.rank_rows is not None:
            return rank_rows(args.rank_rows, args.rows_out)
        plan = make_plan(args)
        if args.progress:
            if not any((plan.out / stage).is_dir() for stage in ("genotypes", "search")):
                raise UserInputError(f"--progress: {plan.out} holds no benchmark (no genotypes/ or search/); pass the "
                                     "--out of a started benchmark with the flags it ran with")
            report_progress(plan)
            print((plan.out / "progress.md").read_text(), end="")
            return 0
        if args.cells_only:
            names = write_fixed_cells(plan, search_space_rules(plan))
            print(f"cells written to {plan.out / 'genotypes'}: {', '.join(names)}")
            return 0
        if plan.out.exists() and any(plan.out.iterdir()) and not args.resume:
            raise UserInputError(f"--out {plan.out} is not empty; pass a new directory (runs are never overwritten) "
                                 "or --resume to continue the benchmark there")
        summary = run_benchmark(plan, args.resume, args.searches_only)
    except (UserInputError, BenchmarkError) as error:
        print(f"search_vs_random: {error}", file=sys.stderr)
        return 2 if isinstance(error, UserInputError) else 1
    except KeyboardInterrupt:
        print(f"search_vs_random: interrupted; the logs are in {args.out / 'logs'}; continue with --resume",
              file=sys.stderr)
        return 130
    if summary is None:
        print(f"searches done; the cells: {plan.out / 'genotypes'}; retrain them with --resume")
        return 0
    stats = {arm: ArmStats(**values) for arm, values in summary["stats"].items()}
    print(f"summary: {plan.out / 'summary.json'}, {plan.out / 'summary.md'}, {plan.out / 'summary.png'}")
    if summary["rank_agreement"] is not None:
        print(rank_agreement_line(summary["rank_agreement"]))
    print("\n".join(summary["verdict"]["lines"]))
    print(table(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
