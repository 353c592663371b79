"""Do two searches end a cycle with the same α? Two search run dirs (e.g. one seed under two schedules):

    python benchmarks/alpha_agreement.py WARMUP/search/search_0 PROGRESSIVE/search/search_0 --cycle 0
    python benchmarks/alpha_agreement.py RUN RUN --cycle 0 --cycle-b 1    (how far one search moved between cycles)

Per cell type, from each run's ``alphas/cycle_<k>.json`` (softmax(α) per edge) and ``genotypes/cycle_<k>.json``: on how
many edges the strongest op is the same, the mean total-variation distance between the two edges' op distributions
(0: the same distribution, 1: disjoint), and how many of the two cells' edges differ. A search whose result is a
property of the data and the space gives high agreement; one that small differences move gives little.
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

from benchmarks.search_vs_random import genotype_distance  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402
from search_space.genotypes import Genotype  # noqa: E402

CELLS = ("normal", "reduce")


def read_cycle(run_dir: Path, cycle: int) -> tuple[dict[str, Any], Genotype]:
    alphas, genotype = run_dir / "alphas" / f"cycle_{cycle}.json", run_dir / "genotypes" / f"cycle_{cycle}.json"
    for path in (alphas, genotype):
        if not path.is_file():
            raise UserInputError(f"{path} does not exist; pass search run dirs that reached the end of cycle {cycle}")
    return json.loads(alphas.read_text()), Genotype.from_json(genotype.read_text())


def strongest(probs: Sequence[float]) -> int:
    return max(range(len(probs)), key=probs.__getitem__)  # ties: the earlier op


def agreement(a: dict[str, Any], b: dict[str, Any], cell_a: Genotype, cell_b: Genotype) -> dict[str, dict[str, Any]]:
    """Per cell type: the comparison described in the module docstring."""
    if a["primitives"] != b["primitives"] or any(len(a[cell]) != len(b[cell]) for cell in CELLS):
        raise UserInputError("the two α files are of different search spaces (primitives or edges); pass two runs "
                             "of one space")
    cells_differ = genotype_distance(cell_a, cell_b)
    result = {}
    for cell in CELLS:
        pairs = list(zip(a[cell], b[cell]))
        distances = [0.5 * sum(abs(p - q) for p, q in zip(edge_a, edge_b)) for edge_a, edge_b in pairs]
        result[cell] = {"edges": len(pairs),
                        "same_strongest_op": sum(strongest(edge_a) == strongest(edge_b) for edge_a, edge_b in pairs),
                        "mean_total_variation": sum(distances) / len(distances),
                        "cells_differ": cells_differ[cell], "cell_edges": len(getattr(cell_a, cell))}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs=2, type=Path, help="two search run dirs")
    parser.add_argument("--cycle", type=int, default=0, help="the cycle whose end to compare")
    parser.add_argument("--cycle-b", type=int, help="the second run's cycle, if another (default: --cycle)")
    parser.add_argument("--out", type=Path, help="also write the comparison here (JSON)")
    args = parser.parse_args(argv)
    try:
        cycle_b = args.cycle if args.cycle_b is None else args.cycle_b
        (alpha_a, cell_a), (alpha_b, cell_b) = (read_cycle(run, cycle)
                                                for run, cycle in zip(args.runs, (args.cycle, cycle_b)))
        result = agreement(alpha_a, alpha_b, cell_a, cell_b)
    except UserInputError as error:
        print(f"alpha_agreement: {error}", file=sys.stderr)
        return 2
    for cell, row in result.items():
        print(f"{cell}: strongest op the same on {row['same_strongest_op']} of {row['edges']} edges, mean total "
              f"variation {row['mean_total_variation']:.3f}; cells differ in {row['cells_differ']} of "
              f"{row['cell_edges']} edges")
    if args.out:
        cycles = {"cycle": args.cycle} if cycle_b == args.cycle else {"cycle": args.cycle, "cycle_b": cycle_b}
        args.out.write_text(json.dumps({"runs": [str(run) for run in args.runs], **cycles, **result}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
