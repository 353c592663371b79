"""Do two judgings of one supernet's ops agree? Two ``op_strength.py`` files of one search (e.g. on the test set and
on α's split, or on two image counts):

    python benchmarks/strength_agreement.py DIR/op_strength/search_2_final.json <run>/op_strength_arch.json

Per cell type: how many edges of the two strength cells differ, on how many edges the strongest op is the same, and
Kendall's τ-b between the two files' gains over the cut edge across every (edge, op) both judged; and how far α's
cell lies from each strength cell. If the strengths are a property of the weights, not of the images, τ is high and
the cells agree.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.search.derive import NONE_OP  # noqa: E402
from benchmarks.rank_correlation import kendall_tau_b  # noqa: E402
from benchmarks.search_vs_random import genotype_distance  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402
from search_space.genotypes import Genotype  # noqa: E402


def gains(result: dict, kind: str) -> dict[tuple[int, int], float]:
    """``(edge, op)`` → accuracy minus the cut edge's, for every judged op but none."""
    none = result["primitives"].index(NONE_OP)
    return {(edge, op): acc - row[none] for edge, row in enumerate(result["accuracy"][kind])
            for op, acc in enumerate(row) if op != none and acc is not None}


def strongest(result: dict, kind: str) -> list[int]:
    by_edge: dict[int, tuple[float, int]] = {}
    for (edge, op), gain in gains(result, kind).items():
        by_edge[edge] = max(by_edge.get(edge, (-float("inf"), -1)), (gain, -op))  # ties: the earlier op
    return [-by_edge[edge][1] for edge in sorted(by_edge)]


def cell(result: dict, name: str) -> Genotype:
    return Genotype.from_json(json.dumps(result[name]))


def agreement(a: dict, b: dict) -> dict[str, dict]:
    """Per cell type: the comparison described in the module docstring."""
    if a["primitives"] != b["primitives"] or a["alpha_genotype"] != b["alpha_genotype"]:
        raise UserInputError("the files judged different supernets (other primitives or α cells); pass two "
                             "op_strength files of one search checkpoint")
    strength_a, strength_b = cell(a, "strength_genotype"), cell(b, "strength_genotype")
    alpha = cell(a, "alpha_genotype")
    differing = genotype_distance(strength_a, strength_b)
    alpha_a, alpha_b = genotype_distance(alpha, strength_a), genotype_distance(alpha, strength_b)
    result = {}
    for kind in a["accuracy"]:
        gains_a, gains_b = gains(a, kind), gains(b, kind)
        common = sorted(set(gains_a) & set(gains_b))
        best_a, best_b = strongest(a, kind), strongest(b, kind)
        result[kind] = {"edges": len(getattr(strength_a, kind)), "strength_cells_differ": differing[kind],
                        "same_strongest_op": sum(x == y for x, y in zip(best_a, best_b)), "judged_edges": len(best_a),
                        "tau": kendall_tau_b([gains_a[k] for k in common], [gains_b[k] for k in common]),
                        "pairs": len(common), "alpha_vs_a": alpha_a[kind], "alpha_vs_b": alpha_b[kind]}
    return result


def report(result: dict[str, dict], a: dict, b: dict) -> str:
    lines = [f"A: {a.get('split', 'test')} images, {a['images']}; B: {b.get('split', 'test')} images, {b['images']}",
             "", "| cell | strength cells: differing edges | same strongest op | τ-b of gains (pairs) | α cell vs A, "
             "vs B (differing edges) |", "|---|---:|---:|---:|---:|"]
    for kind, row in result.items():
        tau = "undefined" if row["tau"] is None else f"{row['tau']:.2f}"
        lines.append(f"| {kind} | {row['strength_cells_differ']} of {row['edges']} | {row['same_strongest_op']} of "
                     f"{row['judged_edges']} | {tau} ({row['pairs']}) | {row['alpha_vs_a']}, {row['alpha_vs_b']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs=2, help="two op_strength.py JSON files of one search")
    args = parser.parse_args(argv)
    try:
        a, b = (json.loads(path.read_text()) for path in args.files)
        result = agreement(a, b)
    except (UserInputError, FileNotFoundError, json.JSONDecodeError, KeyError) as error:
        print(f"strength_agreement: {error}", file=sys.stderr)
        return 2
    print(report(result, a, b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
