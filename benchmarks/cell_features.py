"""Which features of a cell go with its accuracy? Kendall's τ-b of each structural feature against the test accuracy:

    python benchmarks/cell_features.py --runs DIR/retrain/*_seed0 OTHER/retrain/search_1_seed0 [--out features.json]

Each run dir is a finished train.py run (its metrics.json names the cell and its test accuracy). The features count,
in the normal cell, each op that some cell uses, its 5x5 kernels and parameter-free ops, its depth (the longest path
of nodes) and the edges that read the cell's inputs; in the reduction cell, its pools, convs and skips. With a dozen
features and a dozen cells some τ will look strong by chance, so each gets two p: the share of random orders of the
accuracies whose |τ| reaches its own (``--permutations``, seeded), and a family-wise p, the share whose largest |τ|
over all features does (Westfall and Young's max-T), which holds for the whole table at once.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.run.atomic_write import save_json  # noqa: E402
from benchmarks.common import BenchmarkError  # noqa: E402
from benchmarks.training_free_scores import read_cells  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402
from search_space.genotypes import Genotype  # noqa: E402
from search_space.ops import PARAMETER_FREE_OPS  # noqa: E402

INPUTS = 2  # a DARTS cell's nodes 0 and 1: the two previous cells' outputs


def depth(edges: Sequence[tuple[str, int]]) -> int:
    """The longest path of the cell's nodes, counted in edges from an input (two edges per node, in order)."""
    level = [0] * INPUTS
    for node in range(len(edges) // 2):
        level.append(1 + max(level[source] for _, source in edges[2 * node:2 * node + 2]))
    return max(level)


def cell_features(genotype: Genotype, normal_ops: Sequence[str]) -> dict[str, float]:
    """The features of one cell (module docstring); ``normal_ops``: the ops counted one by one."""
    normal = [op for op, _ in genotype.normal]
    reduce = [op for op, _ in genotype.reduce]
    features = {f"normal {op}": float(normal.count(op)) for op in normal_ops}
    features["normal 5x5 kernels"] = float(sum("5x5" in op for op in normal))
    features["normal parameter-free"] = float(sum(op in PARAMETER_FREE_OPS for op in normal))
    features["normal depth"] = float(depth(genotype.normal))
    features["normal edges from the inputs"] = float(sum(source < INPUTS for _, source in genotype.normal))
    features["reduction pools"] = float(sum("pool" in op for op in reduce))
    features["reduction convs"] = float(sum("conv" in op for op in reduce))
    features["reduction skips"] = float(reduce.count("skip_connect"))
    return features


def _signs(values: torch.Tensor) -> torch.Tensor:
    """sign(v_i - v_j) for i < j, the last dimension flattened to the pairs."""
    n = values.shape[-1]
    i, j = torch.triu_indices(n, n, offset=1)
    return torch.sign(values[..., i] - values[..., j])


def taus(features: torch.Tensor, accuracy: torch.Tensor) -> torch.Tensor:
    """τ-b of each row of ``features`` [F, n] against each row of ``accuracy`` [B, n]: [B, F], NaN where a ranking is
    all ties. Pairs tied in one ranking count as in scipy (and rank_correlation.kendall_tau_b): the denominator is
    √((pairs − ties in x)(pairs − ties in y))."""
    sx, sy = _signs(features.double()), _signs(accuracy.double())  # [F, P], [B, P]
    untied_x, untied_y = (sx != 0).sum(-1), (sy != 0).sum(-1)
    denominator = torch.sqrt(untied_y[:, None].double() * untied_x[None, :].double())
    return ((sy @ sx.T) / denominator).masked_fill(denominator == 0, float("nan"))


def analyse(cells: dict[str, dict], permutations: int, seed: int) -> dict:
    """{"features": {name: {"tau", "p", "p_familywise"}}, "cells": {cell: {feature: value}}}."""
    genotypes = {name: Genotype.from_json(json.dumps(cell["genotype"])) for name, cell in cells.items()}
    used = sorted({op for genotype in genotypes.values() for op, _ in genotype.normal})
    table = {name: cell_features(genotype, used) for name, genotype in genotypes.items()}
    names = list(next(iter(table.values())))
    x = torch.tensor([[table[cell][feature] for cell in cells] for feature in names])
    accuracy = torch.tensor([float(cell["test_acc"]) for cell in cells.values()], dtype=torch.float64)
    observed = taus(x, accuracy[None])[0]
    generator = torch.Generator().manual_seed(seed)
    orders = torch.stack([torch.randperm(len(accuracy), generator=generator) for _ in range(permutations)])
    null = taus(x, accuracy[orders]).abs()  # [B, F]
    defined = ~torch.isnan(observed)
    largest = null[:, defined].nan_to_num(0).amax(dim=1) if defined.any() else torch.zeros(permutations)
    result = {}
    for k, feature in enumerate(names):
        if not defined[k]:
            result[feature] = {"tau": None, "p": None, "p_familywise": None}
            continue
        reach = observed[k].abs() - 1e-12  # equal |τ| counts as reaching it
        result[feature] = {"tau": float(observed[k]),
                           "p": float((1 + (null[:, k] >= reach).sum()) / (permutations + 1)),
                           "p_familywise": float((1 + (largest >= reach).sum()) / (permutations + 1))}
    return {"features": result, "cells": table, "test_acc": {name: cell["test_acc"] for name, cell in cells.items()},
            "permutations": permutations, "seed": seed}


def report(analysis: dict) -> str:
    features = analysis["features"]
    order = sorted(features, key=lambda f: -abs(features[f]["tau"]) if features[f]["tau"] is not None else 1.0)
    lines = [f"Kendall τ-b of each feature against the test accuracy over {len(analysis['cells'])} cells "
             f"({analysis['permutations']} random orders, seed {analysis['seed']}):", "",
             "| feature | τ-b | p | family-wise p |", "|---|---:|---:|---:|"]
    for feature in order:
        row = features[feature]
        if row["tau"] is None:
            lines.append(f"| {feature} | n/a (equal in every cell) | | |")
        else:
            lines.append(f"| {feature} | {row['tau']:+.2f} | {row['p']:.3f} | {row['p_familywise']:.3f} |")
    cells = sorted(analysis["cells"], key=lambda c: -analysis["test_acc"][c])
    short = [f for f in order if features[f]["tau"] is not None]
    lines += ["", "| cell | test % | " + " | ".join(short) + " |", "|---|---:|" + "---:|" * len(short)]
    for cell in cells:
        values = " | ".join(f"{analysis['cells'][cell][f]:g}" for f in short)
        lines.append(f"| {cell} | {100 * analysis['test_acc'][cell]:.2f} | {values} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="finished train.py run dirs, one budget")
    parser.add_argument("--permutations", type=int, default=20000, help="random orders of the accuracies (p)")
    parser.add_argument("--seed", type=int, default=0, help="of the random orders")
    parser.add_argument("--out", type=Path, default=None, help="also write the analysis here (JSON)")
    args = parser.parse_args(argv)
    try:
        if len(args.runs) < 3:
            raise UserInputError(f"got {len(args.runs)} run dir(s); pass 3 or more finished runs")
        if args.permutations < 1:
            raise UserInputError(f"--permutations {args.permutations}: pass 1 or more")
        if args.out is not None and args.out.exists():
            raise UserInputError(f"--out {args.out} exists; pass a new path (nothing is overwritten)")
        # each run's metrics.json is written once training ends: its test accuracy is final while SNN and energy
        # are still pending
        analysis = analyse(read_cells(args.runs, [], ""), args.permutations, args.seed)
    except (UserInputError, BenchmarkError) as error:
        print(f"cell_features: {error}", file=sys.stderr)
        return 2
    print(report(analysis))
    if args.out is not None:
        save_json(analysis, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
