"""metrics.json rebuilt from a retrain run's train.log, for a run whose machine was lost after its last epoch and
before train.py wrote metrics.json (train.py now writes it as soon as training ends, so new runs do not need this):

    python benchmarks/metrics_from_log.py RUN_DIR [data.root=<this machine's copy of the run's data>]

Reads RUN_DIR/train.log (every ``retrain epoch`` line, and the ``SNN:`` line where the evaluation got that far) and
RUN_DIR/.hydra/config.yaml, and counts the parameters by building the network on the CPU (the data set's class
folders give its number of classes). The log rounds its figures (accuracies to 4 digits). What it cannot give
(firing rates, energy, CPU time) is left out and named in ``pending``, and ``recovered_from`` says where the figures
came from. A log without its last epoch is refused, and an existing metrics.json is never overwritten, only
completed: one whose SNN evaluation is still ``pending`` (the host went during it or, before train.py wrote the SNN's
figures at once, during the energy report) gains the log's ``SNN:`` line, with ``snn_recovered_from``.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the packages live beside benchmarks/
    sys.path.insert(0, str(REPO))

from aso_se.run.atomic_write import save_json  # noqa: E402
from benchmarks.common import run_config, with_overrides  # noqa: E402
from search_space.errors import UserInputError  # noqa: E402
from search_space.genotypes import load_genotype  # noqa: E402
from search_space.network import parameters_m  # noqa: E402

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
START = re.compile(r"train run in \S+ \((?P<device>[^,]+), (?P<world>\d+) process")
EPOCH = re.compile(r"retrain epoch (?P<epoch>\d+)/(?P<epochs>\d+) \| (?P<scalars>.*)$")
SNN = re.compile(r"SNN: (?P<acc>[\d.]+) test accuracy after (?P<steps>\d+) (?P<ending>steps to silence|steps, still "
                 r"firing at snn_max_timesteps) \(QANN (?P<qann>[\d.]+)\); max \|logit difference\| "
                 r"(?P<diff>[\d.e+-]+)")


def _time(line: str) -> datetime | None:
    found = STAMP.match(line)
    return None if found is None else datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")


def read_log(log: Path) -> dict[str, Any]:
    """The log's epochs (the last record of each, as a resumed piece repeats none), its SNN line and its span."""
    history: dict[int, dict[str, float]] = {}
    found: dict[str, Any] = {}
    times = []
    for line in log.read_text(errors="replace").splitlines():
        if (stamp := _time(line)) is not None:
            times.append(stamp)
        if (start := START.search(line)) and "world_size" not in found:
            found.update(device=start["device"], world_size=int(start["world"]))
        elif epoch := EPOCH.search(line):
            words = epoch["scalars"].split()
            history[int(epoch["epoch"]) - 1] = {"epoch": int(epoch["epoch"]) - 1,
                                                **{k: float(v) for k, v in zip(words[::2], words[1::2])}}
            found["epochs"] = int(epoch["epochs"])
        elif snn := SNN.search(line):
            found["snn"] = {"snn_test_acc": float(snn["acc"]), "snn_timesteps": int(snn["steps"]),
                            "snn_silent": snn["ending"] == "steps to silence", "snn_qann_test_acc": float(snn["qann"]),
                            "snn_logit_max_abs_diff": float(snn["diff"])}
    found["history"] = [history[epoch] for epoch in sorted(history)]
    found["wall_time_s"] = (times[-1] - times[0]).total_seconds() if times else None
    return found


def network_parameters_m(cfg: Any, genotype: Any) -> float:
    """Millions of parameters of the run's network, counted as the Retrainer counts them."""
    from hydra.utils import instantiate

    data = instantiate(cfg.data)
    network = instantiate(cfg.model.network)(genotype, neuron=instantiate(cfg.neuron), num_classes=data.num_classes,
                                             in_channels=data.in_channels, image_size=data.image_size, auxiliary=False)
    return parameters_m(network)


def rebuild(run_dir: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    from omegaconf import OmegaConf

    if (run_dir / "metrics.json").exists():
        raise UserInputError(f"{run_dir / 'metrics.json'} exists; this tool only fills in a lost one")
    log = read_log(run_dir / "train.log")
    config = run_config(run_dir)
    epochs, history = config["epochs"], log["history"]
    if len(history) != epochs or history[-1]["epoch"] != epochs - 1:
        raise UserInputError(f"{run_dir / 'train.log'} holds {len(history)} of {epochs} epochs; resume the run "
                             f"(train.py resume={run_dir}) instead")
    genotype = load_genotype(config["genotype"])
    best = max(history, key=lambda record: record["test_acc"])
    qann = config["neuron"]["kind"].endswith("_qann")
    cfg = with_overrides(OmegaConf.create(config), overrides)
    pending = ["snn"] if qann and "snn" not in log else []
    return {"test_acc": history[-1]["test_acc"], "test_loss": history[-1]["test_loss"],
            "best_test_acc": best["test_acc"], "best_epoch": best["epoch"] + 1, "epochs": epochs,
            "params_m": network_parameters_m(cfg, genotype), "history": history, **log.get("snn", {}),
            "wall_time_s": log["wall_time_s"], "cpu_time_s": None, "genotype": genotype.to_json(),
            "world_size": log["world_size"], "global_batch_size": config["batch_size"] * log["world_size"],
            "device": log["device"], "precision": config["trainer"]["precision"], "cuda_graph": config["cuda_graph"],
            "pending": [*pending, "energy", "firing_rates"], "recovered_from": "train.log"}


def fill_snn(run_dir: Path) -> dict[str, Any]:
    """The run's metrics.json with its pending SNN figures taken from the log's ``SNN:`` line."""
    metrics = json.loads((run_dir / "metrics.json").read_text())
    if "snn" not in metrics.get("pending", []):
        raise UserInputError(f"{run_dir / 'metrics.json'} exists with no SNN evaluation pending; this tool only fills "
                             "in a lost metrics.json or its pending SNN figures")
    snn = read_log(run_dir / "train.log").get("snn")
    if snn is None:
        raise UserInputError(f"{run_dir / 'train.log'} holds no SNN line; resume the run (train.py resume={run_dir}) "
                             "to evaluate its SNN")
    return {**metrics, **snn, "pending": [stage for stage in metrics["pending"] if stage != "snn"],
            "snn_recovered_from": "train.log"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a retrain run dir holding train.log and .hydra/config.yaml")
    parser.add_argument("overrides", nargs="*", help="key=value changes to the run's config, e.g. data.root=...")
    args = parser.parse_args(argv)
    try:
        if (args.run_dir / "metrics.json").exists():
            metrics = fill_snn(args.run_dir)
            save_json(metrics, args.run_dir / "metrics.json")
            print(f"{args.run_dir / 'metrics.json'}: SNN {metrics['snn_test_acc']} after {metrics['snn_timesteps']} "
                  f"steps, from train.log; pending {', '.join(metrics['pending']) or 'nothing'}")
            return 0
        metrics = rebuild(args.run_dir, args.overrides)
    except (UserInputError, FileNotFoundError) as error:
        print(f"metrics_from_log: {error}", file=sys.stderr)
        return 2
    save_json(metrics, args.run_dir / "metrics.json")
    print(f"{args.run_dir / 'metrics.json'}: test_acc {metrics['test_acc']} after {metrics['epochs']} epochs, "
          f"{metrics['params_m']:.2f} M parameters; pending {', '.join(metrics['pending'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
