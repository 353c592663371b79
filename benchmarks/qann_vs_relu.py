"""QANN vs ReLU vs BPTT: one cell retrained with each neuron under one budget, several seeds each.

Every run is ``train.py`` with the same overrides but ``neuron=<arm>`` and ``seed=<s>`` (spiking BPTT arms
also get ``neuron.timesteps=--timesteps``). An arm may set its neuron's options: ``st_bif_qann:level=16``
runs ``neuron=st_bif_qann neuron.level=16``; an option with a dot is a run setting of its own:
``st_bif_qann:level=4:snn_finetune.epochs=2`` also fine-tunes the QANN's binary SNN, ``epochs=5`` gives the arm its
own epochs, and ``init_from=<an earlier arm>``
(with ``threshold_init=lsq``) warm-starts each seed's run from that arm's run of the same seed, and
``distill.teacher=<an earlier arm>`` distils it from that run. Writes DIR/summary.json
(every run: test accuracy, the QANN's SNN accuracy, steps to silence, the deployed binary SNN's accuracy at
T = 4 and 8 and energy, train images/s), summary.md (mean ± std per arm and the verdicts: QANN and its SNN
within 1 point of ReLU, the binary SNN at T = 8 / 4 within 1 / 2 points, QANN above BPTT); prints the table
last. Every arm is one Hydra multirun over the seeds, ``train.py -m neuron=<arm> seed=0,1,..`` (run dirs
DIR/train/<arm>_s<seed>; the arms one after another), whose command is printed: rerun an arm or add one by hand.

    python benchmarks/qann_vs_relu.py --out DIR --seeds 3 --launcher local_gpus data=cifar10 data.root=<cifar10> \\
        model=small genotype=DARTS_V2 epochs=5 batch_size=128 cuda_graph=true
    python benchmarks/qann_vs_relu.py --out DIR --smoke    # every code path in about a minute on a CPU
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.run.atomic_write import save_json  # noqa: E402
from benchmarks.common import (  # noqa: E402
    SMOKE,
    Sweep,
    add_launcher_args,
    check_launcher_args,
    compose_config,
    mean_std,
    read_run_json,
    run_into_out,
    run_sweeps,
    same_config,
)
from benchmarks.common import check_overrides as check_run_overrides  # noqa: E402

ARMS = ("relu", "st_bif_qann", "st_bif")
BPTT = ("st_bif", "lif")  # arms trained through time: they get --timesteps
TOLERANCE = 0.01  # "within 1 point" of ReLU's mean test accuracy
RESERVED_KEYS = ("neuron", "seed", "resume")  # set by the benchmark for every run
RUN_KEYS = ("init_from", "threshold_init", "epochs")  # arm options that are run settings though they have no dot


def check_overrides(overrides: Sequence[str]) -> tuple[str, ...]:
    """The user's Hydra overrides, refusing the keys the benchmark sets for every run."""
    return check_run_overrides(overrides, RESERVED_KEYS, "neurons: --arms, seeds: --seeds")


def arm_neuron(arm: str) -> str:
    """The neuron config of an arm: ``st_bif_qann:level=16`` → ``st_bif_qann``."""
    return arm.split(":")[0]


def arm_overrides(arm: str, timesteps: int) -> tuple[str, ...]:
    """``neuron=<name>`` and the arm's ``neuron.<key>=<value>`` options, or ``<group>.<key>=<value>`` as given
    (BPTT arms: their T)."""
    neuron, *options = arm.split(":")
    steps = (f"neuron.timesteps={timesteps}",) if neuron in BPTT else ()
    return (f"neuron={neuron}", *steps, *(option if "." in option.split("=", 1)[0] or option.split("=", 1)[0] in
                                          RUN_KEYS else f"neuron.{option}" for option in options))


def warm_start_from_arms(overrides: Sequence[str], arms: Sequence[str], stage_dir: Path) -> tuple[str, ...]:
    """``init_from=<arm>`` or ``distill.teacher=<arm>`` naming an arm listed before: that arm's run dir of the same
    seed (Hydra fills ``seed``)."""
    names = {arm_name(arm): arm for arm in arms}
    resolved = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key in ("init_from", "distill.teacher") and value in names:
            override = f"{key}={stage_dir / arm_name(value)}_s${{seed}}"
        resolved.append(override)
    return tuple(resolved)


def arm_run_keys(arms: Sequence[str]) -> tuple[str, ...]:
    """The run settings the arms set themselves (``epochs``, ``optim.optimizer.lr``, ``init_from``, ...): keys whose
    values may differ between arms under one budget."""
    keys = {option.split("=", 1)[0] for arm in arms for option in arm.split(":")[1:]}
    return tuple(sorted(key for key in keys if "." in key or key in RUN_KEYS))


def arm_name(arm: str) -> str:
    """The arm in run dir names: ``st_bif_qann:level=16`` → ``st_bif_qann_level16``."""
    return arm.replace(":", "_").replace("=", "")


def plan_sweeps(out: Path, arms: Sequence[str], seeds: int, timesteps: int, common: Sequence[str]) -> list[Sweep]:
    """One multirun per arm over the seeds (arms differ in their overrides, a multirun only in the swept key)."""
    return [Sweep(label=arm_name(arm), script="train.py", stage_dir=out / "train",
                  overrides=(*common,
                             *warm_start_from_arms(arm_overrides(arm, timesteps), arms[:index], out / "train")),
                  key="seed",
                  values=tuple(map(str, range(seeds))),
                  names=tuple(f"{arm_name(arm)}_s{seed}" for seed in range(seeds)),
                  subdir=f"{arm_name(arm)}_s${{seed}}")
            for index, arm in enumerate(arms)]


def collect(run_dir: Path, arm: str) -> dict[str, Any]:
    metrics = read_run_json(run_dir / "metrics.json")
    finetuned = metrics.get("snn_finetune") or {}
    snn_at = finetuned.get("acc_at_t", metrics.get("snn_acc_at_t", {}))  # the SNN deployed: fine-tuned if it was
    return {"arm": arm, "seed": int(run_dir.name.rsplit("_s", 1)[1]), "test_acc": metrics["test_acc"],
            "params_m": metrics["params_m"], "train_images_per_second": metrics["train_images_per_second"],
            "snn_test_acc": metrics.get("snn_test_acc"), "snn_timesteps": metrics.get("snn_timesteps"),
            "snn_acc_t4": snn_at.get("4"), "snn_acc_t8": snn_at.get("8"),
            "energy_per_image_uj": finetuned.get("energy_per_image_uj", metrics.get("energy_per_image_uj")),
            "run_dir": str(run_dir),
            "wall_minutes": metrics["wall_time_s"] / 60}


def _mean(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return mean_std(present)[0] if present else None


def arm_rows(runs: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for arm in arms:
        mine = [run for run in runs if run["arm"] == arm]
        acc, acc_std = mean_std([run["test_acc"] for run in mine])
        snn = [run["snn_test_acc"] for run in mine if run["snn_test_acc"] is not None]
        snn_mean, snn_std = mean_std(snn) if snn else (None, None)
        rows.append({"arm": arm, "n": len(mine), "test_acc": acc, "test_acc_std": acc_std,
                     "snn_test_acc": snn_mean, "snn_test_acc_std": snn_std,
                     **{key: _mean([run[key] for run in mine]) for key in (
                         "snn_timesteps", "snn_acc_t4", "snn_acc_t8", "energy_per_image_uj", "train_images_per_second",
                         "params_m")}})
    return rows


def verdicts(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The issue's checks for every QANN arm ("QANN" for the plain ``st_bif_qann``, else named)."""
    by_arm = {row["arm"]: row for row in rows}
    relu = by_arm.get("relu")
    bptt = next((row for row in rows if arm_neuron(row["arm"]) in BPTT), None)
    lines = []
    for qann in (row for row in rows if arm_neuron(row["arm"]) == "st_bif_qann"):
        name = "QANN" if qann["arm"] == "st_bif_qann" else f"QANN ({qann['arm']})"
        if relu:
            qann_ok = qann["test_acc"] >= relu["test_acc"] - TOLERANCE
            lines.append(f"{name} within 1 point of ReLU? {'YES' if qann_ok else 'NO'}"
                         f" ({100 * (qann['test_acc'] - relu['test_acc']):+.2f} points)")
            if qann["snn_test_acc"] is not None:
                snn_ok = qann["snn_test_acc"] >= relu["test_acc"] - TOLERANCE
                lines.append(f"its SNN within 1 point of ReLU? {'YES' if snn_ok else 'NO'}"
                             f" ({100 * (qann['snn_test_acc'] - relu['test_acc']):+.2f} points)")
            for steps, allowed in ((8, 0.01), (4, 0.02)):  # the binary SNN's targets against the ReLU network
                value = qann.get(f"snn_acc_t{steps}")
                if value is not None:
                    ok = value >= relu["test_acc"] - allowed
                    lines.append(f"its binary SNN at T = {steps} >= ReLU - {100 * allowed:.0f}? {'YES' if ok else 'NO'}"
                                 f" ({100 * (value - relu['test_acc']):+.2f} points)")
            if qann.get("energy_per_image_uj") and relu.get("energy_per_image_uj"):
                ratio = qann["energy_per_image_uj"] / relu["energy_per_image_uj"]
                lines.append(f"its SNN's energy per image: {ratio:.2f}x ReLU's")
            ratio = relu["train_images_per_second"] / qann["train_images_per_second"]
            lines.append(f"{name} train time per image: {ratio:.2f}x ReLU's")
        if bptt:
            lines.append(f"{name} above BPTT {bptt['arm']}? {'YES' if qann['test_acc'] > bptt['test_acc'] else 'NO'}"
                         f" ({100 * (qann['test_acc'] - bptt['test_acc']):+.2f} points)")
    return lines


def _pct(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "—"
    return f"{100 * value:.2f}%" + ("" if std is None else f" ± {100 * std:.2f}")


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| arm | n | test acc | SNN test acc | steps to silence | SNN at T = 4 / 8 | train images/s "
             "| params (M) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        steps = "—" if row["snn_timesteps"] is None else f"{row['snn_timesteps']:.1f}"
        lines.append(f"| {row['arm']} | {row['n']} | {_pct(row['test_acc'], row['test_acc_std'])} | "
                     f"{_pct(row['snn_test_acc'], row['snn_test_acc_std'])} | {steps} | "
                     f"{_pct(row['snn_acc_t4'])} / {_pct(row['snn_acc_t8'])} | "
                     f"{row['train_images_per_second']:.0f} | {row['params_m']:.4f} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    common = (*(SMOKE if args.smoke else ()), *check_overrides(args.overrides))
    if args.smoke and not any(o.startswith("genotype=") for o in common):
        common = (*common, "genotype=DARTS_V2")
    for arm in args.arms:  # bad overrides or arms are refused before any run
        compose_config("train", (*common, *arm_overrides(arm, args.timesteps)), args.launcher)
    out = args.out.resolve()
    sweeps = plan_sweeps(out, args.arms, args.seeds, args.timesteps, common)
    run_dirs = run_sweeps(sweeps, args.launcher, args.resume, out / "logs")
    # one budget: only the neuron, its fine-tuning, the seed and the run settings an arm sets itself differ
    budget = same_config(run_dirs, ignore=("neuron", "snn_finetune", "seed", *arm_run_keys(args.arms)))
    arm_of = {run_dir: arm for sweep, arm in zip(sweeps, args.arms) for run_dir in sweep.run_dirs()}
    runs = [collect(run_dir, arm_of[run_dir]) for run_dir in sorted(run_dirs)]
    rows = arm_rows(runs, args.arms)
    summary = {"runs": runs, "rows": rows, "verdicts": verdicts(rows), "overrides": list(common),
               "timesteps_bptt": args.timesteps, "budget": budget}
    save_json(summary, out / "summary.json")
    (out / "summary.md").write_text(f"# QANN vs ReLU vs BPTT under one budget\n\n`{' '.join(common)}`, "
                                    f"BPTT at T = {args.timesteps}.\n\n{table(rows)}\n\n"
                                    + "\n".join(f"- {line}" for line in summary["verdicts"]) + "\n")
    return summary


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a new or empty directory: every run and the summary")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help="neurons (conf/neuron/), comma-separated; options after colons: st_bif_qann:level=16")
    parser.add_argument("--seeds", type=int, default=3, help="runs per arm (seeds 0..N-1)")
    parser.add_argument("--timesteps", type=int, default=4, help="T of the BPTT arms (st_bif, lif)")
    parser.add_argument("--smoke", action="store_true", help="experiment=smoke for every run: seconds each on a CPU")
    add_launcher_args(parser)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. data=cifar10 epochs=5")
    args = parser.parse_args(argv)
    check_launcher_args(parser, args)
    for name in ("seeds", "timesteps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    args.arms = tuple(arm for arm in args.arms.split(",") if arm)
    if not args.arms or len(set(args.arms)) != len(args.arms):
        parser.error(f"--arms {','.join(args.arms)!r}: need distinct neuron names")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    code, summary = run_into_out("qann_vs_relu", args, run)
    if code:
        return code
    print(f"summary: {args.out / 'summary.json'}, {args.out / 'summary.md'}")
    print("\n".join(summary["verdicts"]))
    print(table(summary["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
