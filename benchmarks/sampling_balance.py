"""How evenly does a search train its ops by the end of each cycle? From search run dirs' α:

    python benchmarks/sampling_balance.py WARMUP/search/search_0 WARMUP/search/search_1 --out FILE

A search step computes, on each edge, the top-k ops of α + Gumbel noise (``search.sampling.k``, read from each run's
saved config): Plackett–Luce sampling without replacement from softmax(α), so op i is computed (and its weights
trained) with the chance that it is among the first k draws. From each run's ``alphas/cycle_<c>.json`` (softmax(α) per
edge; pruned ops 0), per cell type and over the edges: the mean chance that the edge's strongest op is computed, the
mean and the lowest chance of each other op with weights (neither ``none`` nor pruned), and that of a uniform α
(k / unpruned ops). The chances hold at the cycle's end, where α has moved most; an op computed less often trains less.
Beside them, the derivation's margin: by how much, on average, each edge's strongest non-none op leads the next one.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from benchmarks.common import run_config  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402

CELLS = ("normal", "reduce")
NO_WEIGHTS = "none"


def inclusion(probs: Sequence[float], k: int) -> list[float]:
    """Each op's chance to be among the first ``k`` draws without replacement from ``probs`` (0: never drawn)."""
    chances = [0.0] * len(probs)

    def draw(taken: frozenset[int], mass_left: float, path: float, depth: int) -> None:
        if depth == k or mass_left <= 0.0:
            return
        for op, p in enumerate(probs):
            if op in taken or p <= 0.0:
                continue
            reach = path * p / mass_left
            chances[op] += reach
            draw(taken | {op}, mass_left - p, reach, depth + 1)

    draw(frozenset(), float(sum(probs)), 1.0, 0)
    return chances


def cell_balance(edges: Sequence[Sequence[float]], primitives: Sequence[str], k: int) -> dict[str, float]:
    """Over one cell type's edges: the strongest op's, the other weighted ops' (mean, lowest) and a uniform α's
    chance to be computed in a step; and the derivation's margin, the mean lead of each edge's strongest non-none op
    over its runner-up (how firmly α picks the op the cell gets)."""
    strongest, others, uniform, leads = [], [], [], []
    for probs in edges:
        candidates = sorted((p for op, p in enumerate(probs) if primitives[op] != NO_WEIGHTS), reverse=True)
        leads.append(candidates[0] - candidates[1] if len(candidates) > 1 else candidates[0])
        chances = inclusion(probs, k)
        best = max(range(len(probs)), key=probs.__getitem__)  # ties: the earlier op
        strongest.append(chances[best])
        others += [chances[op] for op, p in enumerate(probs)
                   if op != best and p > 0.0 and primitives[op] != NO_WEIGHTS]
        unpruned = sum(p > 0.0 for p in probs)
        uniform.append(min(k, unpruned) / unpruned)
    return {"strongest": sum(strongest) / len(strongest),
            "others_mean": sum(others) / len(others) if others else float("nan"),
            "others_min": min(others) if others else float("nan"),
            "uniform": sum(uniform) / len(uniform),
            "strongest_probability": sum(max(probs) for probs in edges) / len(edges),
            "op_lead": sum(leads) / len(leads)}


def run_balance(run_dir: Path, k: int | None = None) -> dict[str, Any]:
    """Every cycle of one search run: ``{"k": k, "arch_lr": ..., "cycles": {c: {cell: cell_balance}}}``."""
    files = sorted((run_dir / "alphas").glob("cycle_*.json"), key=lambda path: int(path.stem.split("_")[1]))
    if not files:
        raise UserInputError(f"{run_dir / 'alphas'} holds no cycle_<c>.json; pass search run dirs that ended a cycle")
    config_file = run_dir / ".hydra" / "config.yaml"
    config = run_config(run_dir) if config_file.is_file() else {}
    if k is None:
        k = config.get("search", {}).get("sampling", {}).get("k", "missing")
        if k == "missing":
            raise UserInputError(f"{config_file} is missing or names no search.sampling.k; pass --k")
    if k is None:
        raise UserInputError(f"{run_dir} computes every op at every step (search.sampling.k: null): nothing to "
                             "balance")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise UserInputError(f"k={k!r}: pass --k a positive integer")
    sampling = config.get("search", {}).get("sampling", {})
    if sampling.get("weight_threshold", 0.0) or not sampling.get("gumbel", True):
        raise UserInputError(f"{run_dir} samples with a weight threshold or without Gumbel noise, which this does not "
                             "model; pass runs of search.sampling.weight_threshold=0 and gumbel=true")
    cycles = {}
    for path in files:
        alphas = json.loads(path.read_text())
        cycles[path.stem.split("_")[1]] = {cell: cell_balance(alphas[cell], alphas["primitives"], k)
                                           for cell in CELLS}
    return {"k": k, "arch_lr": config.get("optim", {}).get("arch", {}).get("lr"), "cycles": cycles}


def report(balances: dict[str, dict[str, Any]]) -> str:
    lines = ["| run | cycle | cell | strongest op's max prob (mean) | strongest computed | others computed: mean "
             "(lowest) | uniform α | op lead (mean) |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for run, balance in balances.items():
        for cycle, cells in balance["cycles"].items():
            for cell, b in cells.items():
                lines.append(f"| {run} | {cycle} | {cell} | {b['strongest_probability']:.2f} | {b['strongest']:.2f} "
                             f"| {b['others_mean']:.2f} ({b['others_min']:.2f}) | {b['uniform']:.2f} "
                             f"| {b['op_lead']:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="search run dirs (each with alphas/cycle_<c>.json)")
    parser.add_argument("--k", type=int, default=None, help="ops per edge and step (default: each run's config)")
    parser.add_argument("--out", type=Path, default=None, help="also write the numbers here as JSON")
    args = parser.parse_args(argv)
    try:
        balances = {str(run): run_balance(run, args.k) for run in args.runs}
    except UserInputError as error:
        print(f"sampling_balance: {error}", file=sys.stderr)
        return 2
    print(report(balances))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(balances, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
