"""When does a retrain rank its cells as it ends? Kendall's τ-b, over the cells, between the test accuracy at epoch e
(the mean of a window of epochs ending there, against epoch-to-epoch noise) and the accuracy at the last epoch:

    python benchmarks/ranking_over_epochs.py --runs DIR/retrain/*_seed0 --epochs 10,30,60,90,120,150,170

Each run dir is a train.py run; its curve is the `test/acc` scalar of its TensorBoard files (resumed pieces
included), one value per epoch. A low τ early says a short budget would rank these cells differently.
``--tag train/loss`` (or train/acc, test/loss) ranks by another logged curve, still against the last test accuracy;
a loss ranks low-is-better. ``--unfinished RUN...`` places runs still training among the finished ones at the epoch
each has reached, beside how much the finished runs gained from that epoch to their last: a measured standing, not a
forecast of where the run ends; with ``--tag`` they are placed by that curve too.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from benchmarks.common import run_labels  # noqa: E402
from benchmarks.rank_correlation import kendall_tau_b  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402

TAG = "test/acc"


def read_curve(run: Path, tag: str = TAG) -> list[float]:
    """The run's `tag` scalar per epoch, in order; a step logged by two pieces keeps the later piece's value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # pieces in the order they started: the file name holds its writer's start time (mtimes do not survive a clone)
    files = sorted((run / "tb").glob("events.out.tfevents.*"), key=lambda f: int(f.name.split(".")[3]))
    by_step: dict[int, float] = {}
    for path in files:
        events = EventAccumulator(str(path), size_guidance={"scalars": 0})
        events.Reload()
        if tag in events.Tags()["scalars"]:
            by_step.update({event.step: event.value for event in events.Scalars(tag)})
    if not by_step:
        raise UserInputError(f"{run}: no {tag} scalars under {run / 'tb'}; pass run dirs of train.py retrains")
    return [by_step[step] for step in sorted(by_step)]


def tau_at(curves: dict[str, list[float]], epoch: int, window: int, final: Sequence[float] | None = None,
           lower_is_better: bool = False) -> tuple[float | None, list[float]]:
    """τ-b between the window's mean ending at `epoch` (1-based) and `final` (default: each curve's last value),
    and those means."""
    means = [statistics.fmean(curve[max(0, epoch - window):epoch]) for curve in curves.values()]
    final = [curve[-1] for curve in curves.values()] if final is None else final
    return kendall_tau_b([-m if lower_is_better else m for m in means], list(final)), means


def report(curves: dict[str, list[float]], epochs: Sequence[int], window: int, tag: str = TAG,
           final: Sequence[float] | None = None) -> str:
    """The table; `curves` hold `tag`, ranked against `final` (the last test accuracies) unless `tag` is TAG."""
    last = len(next(iter(curves.values())))
    loss = "loss" in tag
    head = f"τ-b vs epoch {last}" if tag == TAG else f"τ-b of {tag} vs epoch {last}'s {TAG}"
    lines = [f"| epoch | {head} | " + " | ".join(curves) + " |", "|---:|---:|" + "---:|" * len(curves)]
    for epoch in epochs:
        tau, means = tau_at(curves, epoch, window, final, lower_is_better=loss)
        shown = "undefined" if tau is None else f"{tau:.2f}"
        values = [f"{mean:.3f}" if loss else f"{100 * mean:.1f}" for mean in means]
        lines.append(f"| {epoch} | {shown} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def standings(curves: dict[str, list[float]], unfinished: dict[str, list[float]], window: int, tag: str = TAG,
              ranked: dict[str, list[float]] | None = None,
              ranked_unfinished: dict[str, list[float]] | None = None) -> str:
    """Each unfinished run at its last logged epoch e: its window mean, its place among the finished runs' window means
    at e, and the finished runs' gain from e to their last epoch (their last test accuracy minus their mean at e).
    With another `tag`, its window mean of that curve (`ranked_unfinished`) and its place among `ranked` at e too."""
    last = len(next(iter(curves.values())))
    other = tag != TAG and ranked is not None and ranked_unfinished is not None
    extra = (f" {tag} | place by {tag} |", "---:|---:|") if other else ("", "")
    lines = [f"| unfinished run | epoch | test acc | place at that epoch among it and {len(curves)} finished "
             f"| finished runs' gain to epoch {last}: mean ± std (min to max) |{extra[0]}",
             "|---|---:|---:|---:|---:|" + extra[1]]
    for label, curve in unfinished.items():
        epoch = len(curve)
        mean = statistics.fmean(curve[max(0, epoch - window):epoch])
        _, means = tau_at(curves, epoch, window)
        gains = [100 * (finished[-1] - at) for finished, at in zip(curves.values(), means)]
        spread = f"{statistics.stdev(gains):.2f}" if len(gains) > 1 else "undefined"
        place = 1 + sum(at > mean for at in means)
        row = (f"| {label} | {epoch} | {100 * mean:.1f} | {place} of {len(means) + 1} "
               f"| {statistics.fmean(gains):+.2f} ± {spread} ({min(gains):+.2f} to {max(gains):+.2f}) |")
        if other:
            own = ranked_unfinished[label]
            value = statistics.fmean(own[max(0, epoch - window):epoch])
            _, theirs = tau_at(ranked, epoch, window)
            loss = "loss" in tag  # a loss places low-is-better
            ahead = sum((at < value) if loss else (at > value) for at in theirs)
            row += f" {value:.3f} |" if loss else f" {100 * value:.1f} |"
            row += f" {1 + ahead} of {len(theirs) + 1} |"
        lines.append(row)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="train.py run dirs of one budget")
    parser.add_argument("--epochs", required=True, help="comma-separated epochs (1-based), e.g. 10,30,90")
    parser.add_argument("--window", type=int, default=5, help="epochs averaged, ending at each epoch (default 5)")
    parser.add_argument("--tag", default=TAG, help=f"the TensorBoard curve that ranks (default {TAG}; e.g. train/loss, "
                                                   "test/loss, train/acc); always against the last test accuracy")
    parser.add_argument("--unfinished", type=Path, nargs="+", default=[],
                        help="run dirs still training: each placed among --runs at the last epoch it logged")
    args = parser.parse_args(argv)
    try:
        if len(args.runs) < 2:
            raise UserInputError(f"got {len(args.runs)} run dir; τ needs 2 or more cells")
        try:
            epochs = [int(text) for text in args.epochs.split(",")]
        except ValueError:
            raise UserInputError(f"--epochs {args.epochs!r}: pass comma-separated epochs, e.g. 10,30,90") from None
        if args.window < 1:
            raise UserInputError(f"--window {args.window}: pass 1 or more epochs")
        labels = run_labels([*args.runs, *args.unfinished])
        curves = {label: read_curve(run, args.tag) for label, run in zip(labels, args.runs)}
        unfinished = {label: read_curve(run) for label, run in zip(labels[len(args.runs):], args.unfinished)}
        ranked_unfinished = (None if args.tag == TAG else
                             {label: read_curve(run, args.tag) for label, run in zip(labels[len(args.runs):],
                                                                                     args.unfinished)})
        accuracy = curves if args.tag == TAG else {label: read_curve(run) for label, run in zip(labels, args.runs)}
        final = None if args.tag == TAG else [curve[-1] for curve in accuracy.values()]  # None: the curves' own
        lengths = sorted({len(curve) for curve in curves.values()})
        if len(lengths) > 1:
            raise UserInputError(f"the runs logged {lengths} epochs; pass runs of one budget, all finished")
        bad = [epoch for epoch in epochs if not 1 <= epoch <= lengths[0]]
        if bad:
            raise UserInputError(f"--epochs {bad} lie outside the runs' epochs; pass epochs from 1 to their last")
        done = [label for label, curve in unfinished.items() if len(curve) >= lengths[0]]
        if done:
            raise UserInputError(f"--unfinished {done} logged {lengths[0]} epochs or more; "
                                 "pass finished runs in --runs")
    except UserInputError as error:
        print(f"ranking_over_epochs: {error}", file=sys.stderr)
        return 2
    print(report(curves, epochs, args.window, args.tag, final))
    if unfinished:
        print()
        print(standings(accuracy, unfinished, args.window, args.tag, curves, ranked_unfinished))
    return 0


if __name__ == "__main__":
    sys.exit(main())
