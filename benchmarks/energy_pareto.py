"""Energy-aware search: one search per λ (``search.energy_weight``), each cell retrained under one budget.

Writes DIR/summary.json (per λ and seed: the genotype, test accuracy and energy per image of the
retrained cell), summary.md (the table) and pareto.png (accuracy against energy, the Pareto front
marked); prints the table last. Searches and retrains take the same overrides as search_vs_random.py. Two
stages of Hydra multiruns, their commands printed (rerun a λ or add one by hand with them): per search seed,
``search.py -m search.energy_weight=<λs>`` (DIR/search/w<λ>_s<seed>); then one ``train.py -m
genotype=<the found cells>`` (copied to DIR/genotypes/w<λ>_s<seed>.json; run dirs DIR/retrain/w<λ>_s<seed>).

    python benchmarks/energy_pareto.py --out DIR --weights 0,0.1,0.3 --launcher local_gpus data=cifar10 \\
        data.root=<cifar10>
    python benchmarks/energy_pareto.py --out DIR --smoke    # every code path in about a minute on a CPU
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.run.atomic_write import save_json  # noqa: E402
from benchmarks.common import (  # noqa: E402
    SMOKE,
    BenchmarkError,
    Sweep,
    add_launcher_args,
    check_launcher_args,
    check_overrides,
    collect_retrain,
    compose_config,
    quoted,
    read_run_json,
    run_config,
    run_into_out,
    run_sweeps,
)
from search_space.errors import UserInputError  # noqa: E402


def parse_weights(text: str) -> tuple[float, ...]:
    try:
        weights = tuple(float(value) for value in text.split(","))
    except ValueError:
        raise UserInputError(f"--weights {text!r}: expected numbers separated by commas, e.g. 0,0.1,0.3") from None
    if any(not weight >= 0 for weight in weights) or len(set(weights)) != len(weights):
        raise UserInputError(f"--weights {text!r}: need distinct numbers >= 0 (0 = the plain search)")
    return weights


def search_sweeps(out: Path, weights: Sequence[float], seeds: int, search: Sequence[str]) -> list[Sweep]:
    """Per search seed, one multirun over the λ values."""
    return [Sweep(label=f"search_s{seed}", script="search.py", stage_dir=out / "search",
                  overrides=(*search, f"seed={seed}"), key="search.energy_weight",
                  values=tuple(str(weight) for weight in weights),
                  names=tuple(f"w{weight}_s{seed}" for weight in weights),
                  subdir=f"w${{search.energy_weight}}_s{seed}")
            for seed in range(seeds)]


def retrain_sweep(out: Path, names: Sequence[str], train: Sequence[str]) -> Sweep:
    """One multirun over the found cells DIR/genotypes/<name>.json, all at seed 0."""
    return Sweep(label="retrain", script="train.py", stage_dir=out / "retrain", overrides=(*train, "seed=0"),
                 key="genotype", values=tuple(quoted(out / "genotypes" / f"{name}.json") for name in names),
                 names=tuple(names), subdir="${aso_se.stem:${genotype}}")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (energy, accuracy) points that no other point beats on both (lower energy, higher acc)."""
    return [i for i, (energy, acc) in enumerate(points)
            if not any(e <= energy and a >= acc and (e, a) != (energy, acc) for e, a in points)]


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| λ | runs | test acc (mean) | energy per image µJ (mean) | SOPs | MACs | params (M) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['energy_weight']:g} | {row['n']} | {row['test_acc']:.4f} | {row['energy_uj']:.4g} "
                     f"| {row['sops']:.4g} | {row['macs']:.4g} | {row['params_m']:.4f} |")
    return "\n".join(lines)


def plot(runs: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(run["energy_per_image_uj"], run["test_acc"]) for run in runs]
    front = sorted((points[i] for i in pareto_front(points)))
    figure, axes = plt.subplots(figsize=(6, 4))
    weights = sorted({run["energy_weight"] for run in runs})
    for run, (energy, acc) in zip(runs, points):  # one colour per λ
        shade = weights.index(run["energy_weight"]) / max(len(weights) - 1, 1)
        axes.scatter(energy, acc, s=24, color=plt.cm.viridis(shade))
        axes.annotate(f"λ={run['energy_weight']:g}", (energy, acc), textcoords="offset points", xytext=(4, 4))
    axes.plot(*zip(*front), "k--", alpha=0.5, label="Pareto front")
    axes.set_xlabel("energy per image (µJ, 45 nm)")
    axes.set_ylabel("test accuracy")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def run(args: argparse.Namespace) -> dict[str, Any]:
    common = check_overrides(args.overrides)
    base = SMOKE if args.smoke else ()
    search = (*base, *common, *check_overrides(args.search_override))
    train = (*base, *common, *check_overrides(args.train_override))
    compose_config("search", search, args.launcher)  # bad overrides are refused before any run
    compose_config("train", (*train, "genotype=DARTS_V2"), args.launcher)
    out = args.out.resolve()
    search_dirs = run_sweeps(search_sweeps(out, args.weights, args.seeds, search), args.launcher, args.resume,
                             out / "logs")
    for run_dir in search_dirs:  # the found cells, named as their searches: one retrain multirun over them
        save_json(read_run_json(run_dir / "genotype.json"), out / "genotypes" / f"{run_dir.name}.json")
    retrain_dirs = run_sweeps([retrain_sweep(out, [d.name for d in search_dirs], train)], args.launcher,
                              args.resume, out / "logs")
    runs = []
    for run_dir, search_dir in sorted(zip(retrain_dirs, search_dirs)):
        metrics = read_run_json(run_dir / "metrics.json")
        if "energy_per_image_uj" not in metrics:
            raise BenchmarkError(f"run {run_dir} wrote no energy figures; its log is in {run_dir}")
        searched = run_config(search_dir)
        runs.append({**collect_retrain(run_dir, f"search_{run_dir.name}"),
                     "energy_weight": float(searched["search"]["energy_weight"]), "search_seed": searched["seed"],
                     **{key: metrics[key] for key in ("energy_per_image_uj", "sops_per_image", "macs_per_image")}})
    rows = []
    for weight in args.weights:
        mine = [run for run in runs if run["energy_weight"] == weight]
        rows.append({"energy_weight": weight, "n": len(mine),
                     **{key: statistics.fmean(run[field] for run in mine) for key, field in (
                         ("test_acc", "test_acc"), ("energy_uj", "energy_per_image_uj"), ("sops", "sops_per_image"),
                         ("macs", "macs_per_image"), ("params_m", "params_m"))}})
    front = pareto_front([(row["energy_uj"], row["test_acc"]) for row in rows])
    summary = {"runs": runs, "rows": rows, "pareto_weights": [rows[i]["energy_weight"] for i in front],
               "search_overrides": list(search), "train_overrides": list(train)}
    save_json(summary, out / "summary.json")
    (out / "summary.md").write_text(f"# Energy-aware search: λ sweep\n\nSearch: `{' '.join(search)}`; retrain: "
                                    f"`{' '.join(train)}`.\n\n{table(rows)}\n\nPareto front: λ = "
                                    f"{', '.join(f'{w:g}' for w in summary['pareto_weights'])}\n")
    plot(runs, out / "pareto.png")
    return summary


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a new or empty directory: every run and the summary")
    parser.add_argument("--weights", default="0,0.1,0.3", help="the λ values (search.energy_weight), comma-separated")
    parser.add_argument("--seeds", type=int, default=1, help="searches per λ (seeds 0..N-1)")
    parser.add_argument("--smoke", action="store_true", help="experiment=smoke for every run: seconds each on a CPU")
    add_launcher_args(parser)
    parser.add_argument("--search-override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--train-override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. data=cifar10 neuron=lif")
    args = parser.parse_args(argv)
    check_launcher_args(parser, args)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        args.weights = parse_weights(args.weights)
    except UserInputError as error:
        print(f"energy_pareto: {error}", file=sys.stderr)
        return 2
    code, summary = run_into_out("energy_pareto", args, run)
    if code:
        return code
    print(f"summary: {args.out / 'summary.json'}, {args.out / 'summary.md'}, {args.out / 'pareto.png'}")
    print(table(summary["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
