"""Do training-free scores rank cells like the full budget? Each cell's retrain network scored at initialization.

Every finished retrain run (``--runs``: its metrics.json names the cell and its test accuracy) and every extra cell
(``--cells``: genotype files, scored now and judged once trained) is built as the first run's network (its
.hydra config: size, neuron), from ``--seeds`` initializations, and scored on one batch of ``--images`` training
images (batch norms on the batch's statistics, no drop-path, no auxiliary head):

- ``naswot``: log|det K|, K[i, j] = on how many neuron outputs images i and j agree about firing (a nonzero
  level or not): NASWOT's score (Mellor et al., 2021) on spike patterns, as SNASNet (Kim et al., 2022) uses it;
- ``grad_norm``: the L2 norm of the cross-entropy's gradient over all parameters;
- ``params``: millions of parameters (the auxiliary head's excluded, as DARTS counts them).

Prints each cell's scores (mean over the seeds) and Kendall's τ-b of each score against the test accuracy over the
runs, with its exact permutation p; writes ``--out`` (JSON):

    python benchmarks/training_free_scores.py --runs DIR/retrain/*_seed0 --cells CAPPED/genotypes/*.json \\
        --cells-label capped --out scores.json data.root=/tmp/cifar10 data.augment_on_device=false
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.run.atomic_write import save_json  # noqa: E402
from benchmarks.common import BenchmarkError, collect_retrain, read_run_json, run_labels, with_overrides  # noqa: E402
from benchmarks.rank_correlation import kendall_tau_b  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402
from search_space.genotypes import Genotype  # noqa: E402
from search_space.network import parameters_m  # noqa: E402

SCORES = ("naswot", "grad_norm", "params")


def agreement_kernel(codes: torch.Tensor) -> torch.Tensor:
    """``[images, neurons]`` 0/1 codes → ``[images, images]`` counts of neurons on which two images agree."""
    codes = codes.double()
    return codes @ codes.T + (1 - codes) @ (1 - codes).T


def score_network(network: torch.nn.Module, neuron_type: type, images: torch.Tensor, labels: torch.Tensor
                  ) -> dict[str, float]:
    """The three scores of ``network`` as it is (its initialization) on one batch."""
    kernel = torch.zeros(len(images), len(images), dtype=torch.float64)

    def add_codes(module, inputs, output):
        if output.shape[0] != len(images):  # a multi-step neuron's [T, B, ...] or [T·B, ...]
            raise UserInputError(f"a {neuron_type.__name__} output of shape {tuple(output.shape)} is not one row an "
                                 f"image; score one-step networks (neuron=st_bif_qann or relu)")
        kernel.add_(agreement_kernel((output.detach() != 0).flatten(1)))

    hooks = [module.register_forward_hook(add_codes) for module in network.modules() if type(module) is neuron_type]
    if not hooks:
        raise UserInputError(f"the network has no {neuron_type.__name__} neurons to read codes from")
    network.train()  # batch statistics: a fresh network's running ones say nothing
    network.zero_grad(set_to_none=True)
    try:
        logits, _ = network(images)
    finally:
        for hook in hooks:
            hook.remove()
    F.cross_entropy(logits, labels).backward()
    grads = [p.grad.double().pow(2).sum() for p in network.parameters() if p.grad is not None]
    return {"naswot": float(torch.linalg.slogdet(kernel)[1]), "grad_norm": float(torch.stack(grads).sum().sqrt()),
            "params": parameters_m(network)}


def one_batch(cfg, images: int, seed: int):
    """``images`` training images of the run's data (its shuffled order under ``seed``: mixed classes), their labels
    and the data module."""
    data = instantiate(cfg.data)
    train, _ = data.train_loaders(images, seed=seed)
    x, y, *_ = next(iter(train))
    return x, y, data


def read_cells(runs: Sequence[Path], cells: Sequence[Path], label: str) -> dict[str, dict]:
    """name → {"genotype", "test_acc" (None for an extra cell)}; a run is named by its dir (``search_0_seed0``:
    ``search_0``; ``<benchmark dir>:search_0`` where two benchmarks' runs share a name), an extra cell by ``label:``
    and its file's stem."""
    found = {}
    for name, run in zip(run_labels(runs), runs):
        source = name.rsplit("_seed", 1)[0]
        retrain = collect_retrain(run, source)
        found[source] = {"genotype": retrain["genotype"], "test_acc": retrain["test_acc"]}
    for path in cells:
        found[f"{label}:{path.stem}"] = {"genotype": read_run_json(path), "test_acc": None}
    return found


def score_cells(cells: dict[str, dict], cfg, images: int, seeds: int) -> dict[str, dict]:
    x, y, data = one_batch(cfg, images, seed=0)
    neuron = instantiate(cfg.neuron)
    neuron_type = type(neuron())
    for name, cell in cells.items():
        genotype = Genotype.from_json(json.dumps(cell["genotype"]))
        per_seed = []
        for seed in range(seeds):
            torch.manual_seed(seed)
            network = instantiate(cfg.model.network)(genotype, neuron=neuron, num_classes=data.num_classes,
                                                     in_channels=data.in_channels, image_size=data.image_size,
                                                     auxiliary=False)
            per_seed.append(score_network(network, neuron_type, x, y))
        cell["scores"] = {score: [s[score] for s in per_seed] for score in SCORES}
        cell["mean"] = {score: statistics.fmean(values) for score, values in cell["scores"].items()}
        print(f"{name}: " + ", ".join(f"{score} {value:.4g}" for score, value in cell["mean"].items()), flush=True)
    return cells


def permutation_p(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Two-sided p of τ-b: the share of all orders of ``y`` whose |τ| reaches the observed one (n ≤ 8: exact)."""
    observed = kendall_tau_b(x, y)
    if observed is None or len(y) > 8:
        return None
    reached = [abs(tau) >= abs(observed) - 1e-12 for order in itertools.permutations(y)
               if (tau := kendall_tau_b(x, order)) is not None]
    return sum(reached) / len(reached)


def taus(cells: dict[str, dict]) -> dict[str, dict[str, float | None]]:
    """Per score: τ-b against the runs' test accuracy and its permutation p."""
    trained = [cell for cell in cells.values() if cell["test_acc"] is not None]
    accuracy = [cell["test_acc"] for cell in trained]
    result = {}
    for score in SCORES:
        values = [cell["mean"][score] for cell in trained]
        result[score] = {"tau": kendall_tau_b(values, accuracy), "p": permutation_p(values, accuracy)}
    return result


def table(cells: dict[str, dict], tau: dict[str, dict[str, float | None]]) -> str:
    lines = ["| cell | full-budget test acc | " + " | ".join(SCORES) + " |", "|---|---:|" + "---:|" * len(SCORES)]
    for name, cell in sorted(cells.items(), key=lambda item: -(item[1]["test_acc"] or -1)):
        acc = "not trained" if cell["test_acc"] is None else f"{100 * cell['test_acc']:.2f}%"
        lines.append(f"| {name} | {acc} | " + " | ".join(f"{cell['mean'][s]:.4g}" for s in SCORES) + " |")
    shown = ", ".join(f"{score} {_number(value['tau'])} (p = {_number(value['p'])})" for score, value in tau.items())
    n = sum(cell["test_acc"] is not None for cell in cells.values())
    return "\n".join([*lines, "", f"Kendall τ-b against the full-budget test accuracy over {n} runs: {shown}"])


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="finished retrain run dirs")
    parser.add_argument("--cells", type=Path, nargs="*", default=[], help="genotype files to score beside them")
    parser.add_argument("--cells-label", default="extra", help="names the --cells in the table: <label>:<file stem>")
    parser.add_argument("--images", type=int, default=64, help="images in the scoring batch")
    parser.add_argument("--seeds", type=int, default=3, help="initializations per cell")
    parser.add_argument("--out", type=Path, required=True, help="the scores as JSON")
    parser.add_argument("overrides", nargs="*", help="overrides of the runs' config, e.g. data.root=/tmp/cifar10")
    args = parser.parse_args(argv)
    if args.images < 2 or args.seeds < 1:
        parser.error("--images must be at least 2 and --seeds at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.out.exists():
            raise UserInputError(f"--out {args.out} exists; pass a new path (nothing is overwritten)")
        cells = read_cells(args.runs, args.cells, args.cells_label)
        cfg = with_overrides(OmegaConf.load(args.runs[0] / ".hydra" / "config.yaml"), args.overrides)
        cells = score_cells(cells, cfg, args.images, args.seeds)
    except (UserInputError, BenchmarkError) as error:
        print(f"training_free_scores: {error}", file=sys.stderr)
        return 2
    tau = taus(cells)
    save_json({"images": args.images, "seeds": args.seeds, "config_from": str(args.runs[0]),
               "overrides": list(args.overrides), "cells": cells, "kendall_tau_b": tau}, args.out)
    print(table(cells, tau))
    return 0


if __name__ == "__main__":
    sys.exit(main())
