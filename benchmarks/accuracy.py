"""The accuracy suite: which cells train best under one budget. Each case runs its multiruns (search.py, train.py) into
--out, writes its summary there, and appends one result row per retrained cell to a results file (benchmarks/rows.py).

    python benchmarks/accuracy.py search_vs_random --out DIR --budget full --searches 3 --randoms 3 data.root=<cifar10>
    python benchmarks/accuracy.py retrain_arms --out DIR --arms relu,st_bif_qann --seeds 3 data=cifar10 ...
    python benchmarks/accuracy.py energy_sweep --out DIR --weights 0,0.01,0.03 --seeds 2 data.root=<cifar10>
    python benchmarks/accuracy.py search_vs_random --out DIR --smoke      # every code path on a CPU, no rows

The arguments after the case are the case's own (``<case> --help``): search_vs_random.py (searched vs random cells),
qann_vs_relu.py (one cell retrained as ReLU, QANN and BPTT ST-BIF), energy_pareto.py (one search per λ of
``search.energy_weight``). --label names the protocol in the rows' case (default: the budget, or the λ sweep's space);
rows go to results/search_vs_random.csv, accuracy.csv and energy_sweep.csv; ``--rows-out ''`` writes none.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rows import RESULTS, Measurement, append_rows

CASES = {"search_vs_random": ("search_vs_random", "search_vs_random.csv"),
         "retrain_arms": ("qann_vs_relu", "accuracy.csv"),
         "energy_sweep": ("energy_pareto", "energy_sweep.csv")}
CELL_KIND = {"searched": "searched", "random": "random", "reference": None, "poor": None}  # None: the cell's name
# The search_vs_random rows beyond the retrains (report.py's "search_vs_random_agreement" table shows them).
TAU_METRIC = "Kendall τ-b against the full budget"
DISTANCE_METRIC = "genotype distance between searches"


def percent(run: dict[str, Any], key: str) -> float:
    return round(100 * run[key], 2)


def deployed_snn_rows(case: str, accuracy_at: dict[str, float | None], energy_uj: float | None,
                      note: str) -> list[Measurement]:
    """The binary SNN a user deploys (fine-tuned where the run fine-tuned it): accuracy at T = 4 and 8, energy."""
    rows = [Measurement(case, f"binary SNN, T = {steps}: test accuracy", round(100 * accuracy_at[steps], 2), "%", note)
            for steps in ("4", "8") if accuracy_at.get(steps) is not None]
    if rows and energy_uj:
        rows.append(Measurement(case, "binary SNN: energy per image", round(energy_uj, 1), "µJ", note))
    return rows


def search_vs_random_rows(summary: dict[str, Any], label: str) -> list[Measurement]:
    """A row per retrained cell (test accuracy, energy), then how far apart the searches landed and how the budget
    ranks the cells against the full budget (Kendall τ-b), each where the summary defines it."""
    rows = []
    for arm, kind in CELL_KIND.items():
        for run in summary.get(arm, []):
            cell = Path(run["run_dir"]).name
            case = f"{label}/{kind or cell.rsplit('_seed', 1)[0]}"
            rows.append(Measurement(case, "test accuracy", percent(run, "test_acc"), "%", cell))
            if run.get("energy_per_image_uj"):
                rows.append(Measurement(case, "SNN energy per image", round(run["energy_per_image_uj"]), "µJ", cell))
            rows += deployed_snn_rows(case, run.get("snn_acc_at_t") or {}, run.get("snn_energy_uj"), cell)
    spread = summary.get("search_spread")
    if spread and spread["pairs"]:
        normal, reduce = spread["normal"], spread["reduce"]
        rows.append(Measurement(
            f"{label}/searches", DISTANCE_METRIC, round(normal["mean"] + reduce["mean"], 2), "edges",
            f"differing edges per pair of searched cells, of {normal['edges'] + reduce['edges']}: normal "
            f"{normal['mean']:.2f} (max {normal['max']}), reduce {reduce['mean']:.2f} (max {reduce['max']}); "
            f"{spread['pairs']} pairs of {spread['cells']} cells"))
    ranking = ranking_row(summary.get("rank_agreement"), label)
    return rows + ([] if ranking is None else [ranking])


def ranking_row(agreement: dict[str, Any] | None, label: str) -> Measurement | None:
    """Kendall τ-b of a benchmark's ranking against the full budget's (search_vs_random.rank_agreement) as a row;
    None where τ is not defined (fewer than three cells in common) or not computed (a full benchmark)."""
    if not agreement or agreement["tau"] is None:
        return None
    cells = agreement["cells"]
    p = "" if agreement["p"] is None else f"; p = {agreement['p']:.2f}"
    return Measurement(f"{label}/ranking", TAU_METRIC, round(agreement["tau"], 3), "",
                       f"{len(cells)} cells in common: {', '.join(pair['cell'] for pair in cells)}{p}")


def retrain_arms_rows(summary: dict[str, Any], label: str) -> list[Measurement]:
    rows = []
    for run in summary["runs"]:
        rows.append(Measurement(f"{label}/{run['arm']}", "test accuracy", percent(run, "test_acc"), "%",
                                f"seed {run['seed']}"))
        if run.get("snn_test_acc") is not None:
            rows.append(Measurement(f"{label}/{run['arm']}", "its SNN: test accuracy", percent(run, "snn_test_acc"),
                                    "%", f"seed {run['seed']}; {run['snn_timesteps']} steps"))
        rows += deployed_snn_rows(f"{label}/{run['arm']}", {"4": run.get("snn_acc_t4"), "8": run.get("snn_acc_t8")},
                                  run.get("energy_per_image_uj"), f"seed {run['seed']}")
    return rows


def energy_sweep_rows(summary: dict[str, Any], label: str) -> list[Measurement]:
    rows = []
    for run in summary["runs"]:
        case, note = f"{label}, λ = {run['energy_weight']:g}", f"search seed {run['search_seed']}"
        rows += [Measurement(case, "test accuracy", percent(run, "test_acc"), "%", note),
                 Measurement(case, "SNN energy per image", round(run["energy_per_image_uj"], 1), "µJ", note)]
    return rows


def default_label(case: str, rest: Sequence[str]) -> str:
    if case == "search_vs_random":
        return "full" if "full" in rest and "--budget" in rest else "proxy"
    if case == "energy_sweep":
        return "spike-native space" if any("search_space=spike_native" in arg for arg in rest) else "DARTS space"
    return "retrain_arms"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False, add_help=False)
    parser.add_argument("case", choices=tuple(CASES))
    parser.add_argument("--label", default=None, help="the protocol's name in the rows' case")
    parser.add_argument("--rows-out", default=None, help="the rows file (default: the case's; '' writes none)")
    args, rest = parser.parse_known_args(argv)
    module_name, rows_file = CASES[args.case]
    module = __import__(f"benchmarks.{module_name}", fromlist=["main"])
    code = module.main(rest)
    out = Path(rest[rest.index("--out") + 1]) if "--out" in rest else None
    summary_path = None if out is None else out / "summary.json"
    rows_out = (RESULTS / rows_file if "--smoke" not in rest else "") if args.rows_out is None else args.rows_out
    # Only a run that summarized its cells has rows (not --progress, --cells-only or --searches-only).
    if code != 0 or not rows_out or summary_path is None or not summary_path.is_file() or "--progress" in rest:
        return code
    summary = json.loads(summary_path.read_text())
    make = {"search_vs_random": search_vs_random_rows, "retrain_arms": retrain_arms_rows,
            "energy_sweep": energy_sweep_rows}[args.case]
    count = append_rows(Path(rows_out), make(summary, args.label or default_label(args.case, rest)))
    print(f"{count} rows appended to {rows_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
