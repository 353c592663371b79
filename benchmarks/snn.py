"""The SNN suite: how many steps a trained QANN's SNN needs, with binary or graded ST-BIF spikes, and its energy.

    python benchmarks/snn.py --run outputs/train/<run> --spikes-per-step 1,2,4,15 --samples 1000 \
        [--relu-run outputs/train/<the same cell trained with neuron=relu>] [--case <network>]

Loads the run's best.pt and config, converts the QANN once per spikes-per-step m (graded_st_bif.py;
m = 1 is ST-BIF), and reports the accuracy after 1, 2, 4, ... steps, the steps to silence (where the
SNN equals the QANN) and the energy per image at T = min(8, silence) and at silence, on
search_space/energy.py's three conventions: dense MACs for any multi-bit input (graded spikes, a depthwise
conv's output); MACs over its non-zero entries only (skip_zero_macs); and that with a graded input's
one-spike entries as accumulates (unit_spikes_as_sops). ``--relu-run`` adds the ReLU network's accuracy and
energy on all three. Writes <out>/snn_latency.json and .md, the accuracy against T as a picture
(snn_latency.png) and as TensorBoard scalars (<out>/tb: ``snn_latency/accuracy_m<m>`` at step T), and appends
the accuracy at each T, the steps to silence and the dense energy as result rows to --rows-out (benchmarks/rows.py).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from aso_se.run.checkpoint import load_checkpoint
from benchmarks.rows import RESULTS, Measurement, append_rows
from search_space.energy import count_energy
from search_space.errors import UserInputError
from search_space.genotypes import Genotype
from search_space.qann import convert_to_snn, evaluate_snn

ENERGY_BATCH = 16  # images whose counts give the energy per image (a forward over T steps each)


def load_run(run_dir: Path, data_root: str | None, samples: int | None,
             kind: str = "st_bif_qann") -> tuple[torch.nn.Module, Any]:
    """The run's network with its best weights, and its data config capped at ``samples`` test images."""
    state = load_checkpoint(run_dir / "checkpoints" / "best.pt", kind="train")
    cfg = OmegaConf.create(state["config"])
    if cfg.neuron.kind != kind:
        raise UserInputError(f"{run_dir} trained neuron={cfg.neuron.kind}; pass a neuron={kind} run")
    if data_root is not None:
        cfg.data.root = data_root
    if "augment_on_device" in cfg.data:  # the training's GPU pipeline: the test split reads as usual without it
        cfg.data.augment_on_device = False
    if "num_workers" in cfg.data:
        cfg.data.num_workers = min(cfg.data.num_workers, 2)
    cfg.data.max_test_samples = samples
    data = instantiate(cfg.data)
    network = instantiate(cfg.model.network)(Genotype.from_json(state["genotype"]), neuron=instantiate(cfg.neuron),
                                             num_classes=data.num_classes, in_channels=data.in_channels,
                                             image_size=data.image_size)
    network.load_state_dict(state["model"])
    return network.eval(), data


def energy_uj(model: torch.nn.Module, images: torch.Tensor) -> dict[str, float]:
    """µJ per image on three conventions: dense MACs for multi-bit inputs; MACs of non-zero entries only; and
    that with graded spikes read entry by entry (one spike an accumulate, several a MAC)."""
    with torch.no_grad():
        return {"dense": count_energy(model, images).energy_per_image_uj,
                "skip_zero": count_energy(model, images, skip_zero_macs=True).energy_per_image_uj,
                "unit_sops": count_energy(model, images, unit_spikes_as_sops=True).energy_per_image_uj}


def _uj(energy: dict[str, float]) -> str:
    return " / ".join(f"{energy[key]:,.0f}" if key in energy else "—" for key in ("dense", "skip_zero", "unit_sops"))


def measure(network: torch.nn.Module, batches: list, device: torch.device, spikes_per_step: int,
            max_timesteps: int) -> dict[str, Any]:
    start = time.perf_counter()
    result = evaluate_snn(network, batches, device=device, max_timesteps=max_timesteps, spikes_per_step=spikes_per_step)
    images = batches[0][0][:ENERGY_BATCH].to(device)
    steps = sorted({min(8, result.snn_timesteps), max(result.snn_timesteps, 1)})
    return {"spikes_per_step": spikes_per_step, "qann_accuracy": result.qann_accuracy,
            "snn_accuracy": result.snn_accuracy, "timesteps_to_silence": result.snn_timesteps,
            "silent": result.silent, "prediction_agreement": result.prediction_agreement,
            "accuracy_at": {str(k): v for k, v in result.accuracy_at.items()},
            "energy_uj_at": {str(t): energy_uj(convert_to_snn(network, t, spikes_per_step), images) for t in steps},
            "seconds": time.perf_counter() - start}


def relu_row(run_dir: Path, data_root: str | None, images: torch.Tensor) -> dict[str, Any]:
    """The ReLU network's test accuracy (its metrics.json, the full test set) and energy per image."""
    network, _ = load_run(run_dir, data_root, None, kind="relu")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"run": str(run_dir), "test_acc": metrics["test_acc"],
            "energy_uj": energy_uj(network.to(images.device).eval(), images)}


def measurements(case: str, rows: list[dict[str, Any]], relu: dict[str, Any] | None) -> list[Measurement]:
    """Result rows: per m, the accuracy at each T measured, the steps to silence and the energy per image (dense)."""
    found = []
    for row in rows:
        m = row["spikes_per_step"]
        spikes = "1 spike per step (binary ST-BIF)" if m == 1 else f"{m} spikes per step"
        found += [Measurement(case, f"{spikes}, T = {t}: accuracy", round(100 * acc, 2), "%")
                  for t, acc in row["accuracy_at"].items()]
        found.append(Measurement(case, f"{spikes}: steps to silence", row["timesteps_to_silence"], "steps",
                                 "" if row["silent"] else "still firing at --max-timesteps"))
        found += [Measurement(case, f"{spikes}, T = {t}: energy per image, dense MACs", round(energy["dense"], 1),
                              "µJ", f"{ENERGY_BATCH} test images") for t, energy in row["energy_uj_at"].items()]
    found.append(Measurement(case, "QANN: accuracy", round(100 * rows[0]["qann_accuracy"], 2), "%"))
    if relu is not None:
        found += [Measurement(case, "ReLU ANN, same cell: accuracy", round(100 * relu["test_acc"], 2), "%"),
                  Measurement(case, "ReLU ANN: energy per image, dense MACs", round(relu["energy_uj"]["dense"], 1),
                              "µJ", f"{ENERGY_BATCH} test images")]
    return found


def table(rows: list[dict[str, Any]], relu: dict[str, Any] | None) -> str:
    steps = sorted({int(k) for row in rows for k in row["accuracy_at"]})
    head = " | ".join(f"T = {t}" for t in steps)
    conventions = "dense / skip-zero / one spike an AC"
    lines = [f"| spikes per step | {head} | steps to silence | µJ/image at T = min(8, silence): {conventions} "
             f"| at silence: {conventions} |", "|---:|" + "---:|" * (len(steps) + 3)]
    for row in rows:
        cells = " | ".join(f"{100 * row['accuracy_at'][str(t)]:.2f}" if str(t) in row["accuracy_at"] else "—"
                           for t in steps)
        energy = row["energy_uj_at"]
        early, last = energy[min(energy, key=int)], energy[max(energy, key=int)]
        lines.append(f"| {row['spikes_per_step']} | {cells} | {row['timesteps_to_silence']} "
                     f"| {_uj(early)} | {_uj(last)} |")
    lines.append(f"\nQANN on the same images: {100 * rows[0]['qann_accuracy']:.2f}%.")
    if relu is not None:
        lines.append(f"ReLU network ({relu['run']}): {100 * relu['test_acc']:.2f}% on its full test set, "
                     f"{_uj(relu['energy_uj'])} µJ per image ({conventions}).")
    return "\n".join(lines)


def accuracy_curve(row: dict[str, Any]) -> tuple[list[int], list[float]]:
    """A row's T values and its accuracies there, in %."""
    steps = sorted(int(t) for t in row["accuracy_at"])
    return steps, [100 * row["accuracy_at"][str(t)] for t in steps]


def write_tensorboard(out: Path, rows: list[dict[str, Any]], relu: dict[str, Any] | None) -> None:
    """Accuracy against T per spikes-per-step m, beside the QANN's (and the ReLU network's) as flat lines."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(out / "tb")) as writer:
        for row in rows:
            for t, accuracy in zip(*accuracy_curve(row)):
                writer.add_scalar(f"snn_latency/accuracy_m{row['spikes_per_step']}", accuracy, t)
                writer.add_scalar("snn_latency/qann_accuracy", 100 * row["qann_accuracy"], t)
                if relu is not None:
                    writer.add_scalar("snn_latency/relu_accuracy", 100 * relu["test_acc"], t)


def plot(path: Path, rows: list[dict[str, Any]], relu: dict[str, Any] | None, title: str) -> None:
    """Accuracy (%) against T (log2), one line per spikes-per-step, the QANN and ReLU accuracies dashed."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5, 3.4))
    axes = figure.add_subplot()
    for row in rows:
        axes.plot(*accuracy_curve(row), marker="o", label=f"{row['spikes_per_step']} spike(s) per step")
    axes.axhline(100 * rows[0]["qann_accuracy"], color="black", linestyle="--", linewidth=1, label="QANN")
    if relu is not None:
        axes.axhline(100 * relu["test_acc"], color="grey", linestyle=":", linewidth=1, label="ReLU ANN")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("time steps T")
    axes.set_ylabel("test accuracy (%)")
    axes.set_title(title, fontsize=9)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def stage_cost_rows(case: str, metrics: dict[str, Any], relu: dict[str, Any] | None, note: str) -> list[Measurement]:
    """What the SNN stage (the converted SNN's evaluation, the fine-tuning and the fine-tuned SNN's evaluation; the
    energy reports left out) costs beside the QANN's training, from metrics.json's ``wall_time_marks_s`` (the run's
    wall clock as each stage ended); beside the ReLU run's training too where the QANN started from it."""
    marks = metrics.get("wall_time_marks_s", {})
    if not {"trained", "snn_evaluated", "energy_measured", "finetuned", "finetune_evaluated"} <= marks.keys():
        return []
    stage = (marks["snn_evaluated"] - marks["trained"]) + (marks["finetune_evaluated"] - marks["energy_measured"])
    what = "SNN stage (converted SNN's evaluation, fine-tuning, fine-tuned SNN's evaluation)"
    rows = [Measurement(case, f"{what}: wall", round(stage, 1), "s", note),
            Measurement(case, "QANN training: wall", round(marks["trained"], 1), "s", note),
            Measurement(case, f"{what} / QANN training", round(100 * stage / marks["trained"], 1), "%", note)]
    relu_trained = ((relu or {}).get("wall_time_marks_s") or {}).get("trained")
    if relu_trained:
        both = relu_trained + marks["trained"]
        rows.append(Measurement(case, f"{what} / ReLU and QANN training", round(100 * stage / both, 1), "%",
                                f"ReLU training {relu_trained:.0f} s; {note}"))
    return rows


def metrics_rows(case: str, run: Path, relu_run: Path | None, note: str = "") -> list[Measurement]:
    """Rows from a finished train.py run's metrics.json (its QANN, its exact binary SNN at the reported steps, the
    fine-tuned SNN where ``snn_finetune`` ran) and the ReLU run of the same cell: what every retrain records."""
    def read(path: Path) -> dict[str, Any]:
        try:
            metrics = json.loads((path / "metrics.json").read_text())
        except (OSError, ValueError) as error:
            raise UserInputError(f"{path}/metrics.json is unreadable ({error}); pass a finished run") from error
        if metrics.get("pending"):
            raise UserInputError(f"{path} has not finished {metrics['pending']}; resume it first")
        return metrics

    metrics, rows = read(run), []
    rows.append(Measurement(case, "QANN test accuracy", 100 * metrics["test_acc"], "%", note))
    for t, accuracy in metrics.get("snn_acc_at_t", {}).items():
        rows.append(Measurement(case, f"converted SNN, T = {t}", 100 * accuracy, "%", note))
    if "snn_timesteps" in metrics:
        rows.append(Measurement(case, "converted SNN, steps to silence", metrics["snn_timesteps"], "steps", note))
        rows.append(Measurement(case, f"converted SNN energy per image, T = {metrics['snn_timesteps']} (silence)",
                                metrics["energy_per_image_uj"], "µJ", note))
    finetune = metrics.get("snn_finetune")
    if finetune:
        how = f"{finetune['epochs']} epochs of BPTT at T = {finetune['timesteps']}, lr {finetune['lr']}"
        for t, accuracy in finetune["acc_at_t"].items():
            rows.append(Measurement(case, f"fine-tuned SNN, T = {t}", 100 * accuracy, "%", f"{how}; {note}"))
        rows.append(Measurement(case, f"fine-tuned SNN energy per image, T = {finetune['timesteps']}",
                                finetune["energy_per_image_uj"], "µJ", note))
        rows.append(Measurement(case, f"fine-tuned SNN training, T = {finetune['timesteps']}: throughput",
                                finetune["train_images_per_second"], "images/s", note))
    rows.append(Measurement(case, "QANN training: throughput", metrics["train_images_per_second"], "images/s", note))
    relu = read(relu_run) if relu_run is not None else None
    rows += stage_cost_rows(case, metrics, relu, note)
    if relu is not None:
        rows.append(Measurement(case, "ReLU ANN test accuracy", 100 * relu["test_acc"], "%", note))
        rows.append(Measurement(case, "ReLU ANN energy per image (dense MACs)", relu["energy_per_image_uj"], "µJ",
                                note))
    return rows


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if "--from-metrics" in argv:
        return main_from_metrics(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a train.py run dir of a neuron=st_bif_qann run")
    parser.add_argument("--spikes-per-step", default="1,2,4", help="comma-separated m values (1: binary ST-BIF)")
    parser.add_argument("--samples", type=int, default=None, help="a stratified cap on the test images (all: omit)")
    parser.add_argument("--max-timesteps", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--data-root", default=None, help="where this machine keeps the run's data set")
    parser.add_argument("--out", type=Path, default=None, help="folder for snn_latency.json/.md (default: the run)")
    parser.add_argument("--relu-run", type=Path, default=None, help="the same cell trained with neuron=relu")
    parser.add_argument("--case", default="snn_latency", help="the rows' case, e.g. binary_8x16 (names the network)")
    parser.add_argument("--rows-out", default=str(RESULTS / "snn.csv"),
                        help="the result rows file ('' writes none; binary spikes at low T: results/binary_snn.csv)")
    args = parser.parse_args(argv)
    try:
        values = [int(v) for v in args.spikes_per_step.split(",")]
    except ValueError:
        parser.error(f"--spikes-per-step {args.spikes_per_step!r}: give integers >= 1, e.g. 1,2,4")
    try:
        network, data = load_run(args.run, args.data_root, args.samples)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        _, test = data.train_loaders(args.batch_size, seed=0)
        batches = list(itertools.islice(test, None))
        rows = [measure(network.to(device), batches, device, m, args.max_timesteps) for m in values]
        relu = (None if args.relu_run is None else
                relu_row(args.relu_run, args.data_root, batches[0][0][:ENERGY_BATCH].to(device)))
    except UserInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = args.out or args.run
    out.mkdir(parents=True, exist_ok=True)
    report = {"run": str(args.run), "images": sum(len(y) for _, y in batches), "device": str(device),
              "torch": torch.__version__, "rows": rows, "relu": relu}
    (out / "snn_latency.json").write_text(json.dumps(report, indent=2))
    (out / "snn_latency.md").write_text(table(rows, relu) + "\n")
    write_tensorboard(out, rows, relu)
    plot(out / "snn_latency.png", rows, relu, f"{args.run.name}: SNN accuracy against time steps")
    print(table(rows, relu))
    if args.rows_out:
        count = append_rows(Path(args.rows_out), measurements(args.case, rows, relu))
        print(f"{count} rows appended to {args.rows_out}")
    return 0


def main_from_metrics(argv: list[str]) -> int:
    """``--from-metrics --run <QANN run> [--relu-run <run>] --case <name>``: rows from the runs' metrics.json."""
    parser = argparse.ArgumentParser(description="result rows from finished train.py runs' metrics.json")
    parser.add_argument("--from-metrics", action="store_true", required=True)
    parser.add_argument("--run", type=Path, required=True, help="a finished neuron=st_bif_qann train.py run")
    parser.add_argument("--relu-run", type=Path, default=None, help="the same cell trained with neuron=relu")
    parser.add_argument("--case", required=True, help="the rows' case, e.g. darts_v2_8x16_level4_seed0")
    parser.add_argument("--note", default="", help="the budget: network, epochs, images, seed")
    parser.add_argument("--rows-out", default=str(RESULTS / "binary_snn.csv"), help="the result rows file")
    args = parser.parse_args(argv)
    try:
        rows = metrics_rows(args.case, args.run, args.relu_run, args.note)
    except UserInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for row in rows:
        print(f"{row.case} | {row.metric} | {row.value:.4g} {row.unit}")
    if args.rows_out:
        print(f"{append_rows(Path(args.rows_out), rows)} rows appended to {args.rows_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
