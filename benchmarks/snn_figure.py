"""The binary SNN's accuracy against its time steps, drawn from the result rows (results/binary_snn.csv).

    python benchmarks/snn_figure.py        # writes benchmarks/figures/binary_snn_accuracy_vs_t.png
    python benchmarks/snn_figure.py --cases darts_v2_8x16_level4_warm_t4,darts_v2_8x16_level4_t4 --out fig.png

One curve per (case, network) of the rows named "<network>, T = <t>" (converted or fine-tuned SNN), the newest row
of each; a dashed line at the case's "ReLU ANN test accuracy" in the curve's colour, the target every SNN of the
case is judged against. RESULTS.md shows the figure beside the table of the same rows.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import AT_T, newest
from benchmarks.rows import RESULTS, read_rows

FIGURE = Path(__file__).resolve().parent / "figures" / "binary_snn_accuracy_vs_t.png"
# The CIFAR-10 8×16 arms of the binary-SNN section (the MNIST smoke case and the one-lever rows left out).
DEFAULT_CASES = ("darts_v2_8x16_level4_warm_t4", "darts_v2_8x16_level4_warm_t4_seed1", "darts_v2_8x16_level4_15ep",
                 "darts_v2_spike_native_8x16_level4_warm_t4")
RELU = "ReLU ANN test accuracy"


def curves(rows: list[dict[str, str]], cases: tuple[str, ...]) -> tuple[dict[tuple[str, str], dict[int, float]],
                                                                         dict[str, float]]:
    """``{(case, network): {T: accuracy %}}`` and ``{case: ReLU accuracy %}`` from the newest rows of ``cases``."""
    found: dict[tuple[str, str], dict[int, float]] = {}
    relu: dict[str, float] = {}
    for (case, metric), row in newest([row for row in rows if row["case"] in cases]).items():
        match = AT_T.match(metric)
        if match and row["unit"] == "%":
            found.setdefault((case, match["network"]), {})[int(match["t"])] = float(row["value"])
        elif metric == RELU:
            relu[case] = float(row["value"])
    return found, relu


def draw(found: dict[tuple[str, str], dict[int, float]], relu: dict[str, float], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    for index, ((case, network), points) in enumerate(found.items()):
        color = f"C{index % 10}"
        steps = sorted(points)
        axes.plot(steps, [points[t] for t in steps], "o-", color=color, label=f"{case}: {network}")
        if case in relu:
            axes.axhline(relu[case], color=color, linestyle="--", linewidth=0.8)
    axes.set_xscale("log", base=2)
    axes.set_xticks([1, 2, 4, 6, 8, 16], labels=["1", "2", "4", "6", "8", "16"])
    axes.set_xlabel("time steps T (binary spikes)")
    axes.set_ylabel("test accuracy (%)")
    axes.set_title("Binary SNN accuracy against T (dashed: the same cell as ReLU)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated cases of the rows")
    parser.add_argument("--rows", type=Path, default=RESULTS / "binary_snn.csv", help="the result rows file")
    parser.add_argument("--out", type=Path, default=FIGURE, help="the PNG to write")
    args = parser.parse_args(argv)
    cases = tuple(case for case in args.cases.split(",") if case)
    found, relu = curves(read_rows(args.rows), cases)
    missing = [case for case in cases if not any(case == c for c, _ in found)]
    if missing:
        print(f"error: no accuracy-against-T rows for {', '.join(missing)} in {args.rows}; pass cases it has",
              file=sys.stderr)
        return 2
    draw(found, relu, args.out)
    print(f"wrote {args.out} ({len(found)} curves)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
