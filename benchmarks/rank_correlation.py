"""Do two retrain budgets rank the cells alike? Kendall's τ-b between two search_vs_random.py summaries.

Pairs the cells retrained in both (by genotype, not by name: the searched cells of two benchmarks differ, the
random and reference ones recur) and correlates their mean test accuracies; prints one line and a table:

    python benchmarks/search_vs_random.py --out PROXY --searches-from FULL --retrain-epochs 5 ...  # FULL's cells
    python benchmarks/rank_correlation.py --proxy PROXY/summary.json --full FULL/summary.json
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from search_space.errors import UserInputError  # noqa: E402
from search_space.genotypes import Genotype  # noqa: E402

ARMS = ("searched", "random", "reference", "poor")  # search_vs_random.ARMS, without importing torch for it


@dataclass(frozen=True)
class Cell:
    """A genotype's retrains in one summary: its arm, the sources that retrained it and their mean test accuracy."""

    arm: str
    names: tuple[str, ...]
    mean: float


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's τ-b (ties in either ranking counted as in scipy.stats.kendalltau); None when a ranking is all
    ties, where it is undefined. O(n²): a benchmark has a handful of cells."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_b needs two sequences of one length, got {len(x)} and {len(y)}")
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue  # tied in both: in neither denominator term's count of untied pairs
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


def read_cells(path: Path) -> dict[str, Cell]:
    """A summary's cells keyed by their genotype (canonical JSON), each with its mean test accuracy over runs."""
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserInputError(f"{path}: no such file; pass a summary.json written by search_vs_random.py") from None
    except (OSError, json.JSONDecodeError) as error:
        raise UserInputError(f"{path}: not a readable JSON summary ({error})") from None
    if not isinstance(summary, dict) or not any(summary.get(arm) for arm in ARMS):
        raise UserInputError(f"{path}: no retrained cell in it (no runs under {', '.join(ARMS)}); "
                             "pass a summary.json written by search_vs_random.py")
    runs: dict[str, list[tuple[str, str, float]]] = {}
    for arm in ARMS:
        for run in summary.get(arm) or []:
            try:
                key = Genotype.from_json(json.dumps(run["genotype"])).to_json()
                runs.setdefault(key, []).append((arm, run["source"], float(run["test_acc"])))
            except (KeyError, TypeError, ValueError, UserInputError) as error:
                raise UserInputError(f"{path}: a run under {arm} lacks a valid genotype, source or test_acc "
                                     f"({error})") from None
    return {key: Cell(arm=entries[0][0], names=tuple(dict.fromkeys(name for _, name, _ in entries)),
                      mean=statistics.fmean(acc for _, _, acc in entries))
            for key, entries in runs.items()}


@dataclass(frozen=True)
class Correlation:
    tau: float | None
    pairs: tuple[tuple[Cell, Cell], ...]  # (proxy, full) per cell in common, in the proxy summary's order


def correlate(proxy: Mapping[str, Cell], full: Mapping[str, Cell]) -> Correlation:
    common = [key for key in proxy if key in full]
    if len(common) < 2:
        raise UserInputError(f"the summaries have {len(common)} cell(s) in common (by genotype), τ needs 2 or more; "
                             "compare benchmarks that retrained the same random/reference cells")
    pairs = tuple((proxy[key], full[key]) for key in common)
    return Correlation(kendall_tau_b([p.mean for p, _ in pairs], [f.mean for _, f in pairs]), pairs)


def ranks(values: Sequence[float]) -> list[float]:
    """1 = best (highest accuracy); ties share their mean rank."""
    order = sorted(values, reverse=True)
    return [statistics.fmean(i + 1 for i, v in enumerate(order) if v == value) for value in values]


def report(result: Correlation, proxy_path: Path, full_path: Path) -> str:
    tau = "undefined (one budget ties every cell)" if result.tau is None else f"{result.tau:.3f}"
    lines = [f"Kendall τ-b = {tau} over {len(result.pairs)} cells in common (proxy {proxy_path}, full {full_path})",
             "| cell | arm | proxy acc | full acc | proxy rank | full rank |", "|---|---|---:|---:|---:|---:|"]
    proxy_ranks = ranks([p.mean for p, _ in result.pairs])
    full_ranks = ranks([f.mean for _, f in result.pairs])
    for (p, f), rp, rf in zip(result.pairs, proxy_ranks, full_ranks):
        name = "/".join(p.names) if p.names == f.names else f"{'/'.join(p.names)} = {'/'.join(f.names)}"
        lines.append(f"| {name} | {p.arm} | {p.mean:.4f} | {f.mean:.4f} | {rp:g} | {rf:g} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proxy", type=Path, required=True, help="summary.json of the proxy-budget benchmark")
    parser.add_argument("--full", type=Path, required=True, help="summary.json of the full-budget benchmark")
    args = parser.parse_args(argv)
    try:
        result = correlate(read_cells(args.proxy), read_cells(args.full))
    except UserInputError as error:
        print(f"rank_correlation: {error}", file=sys.stderr)
        return 2
    print(report(result, args.proxy, args.full))
    return 0


if __name__ == "__main__":
    sys.exit(main())
