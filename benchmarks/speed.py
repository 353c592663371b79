"""The speed suite: one case per run, its measurements appended as rows (benchmarks/rows.py) to a results file.

    python benchmarks/speed.py --case st_bif          # the fused neuron against spikingjelly and its byte floor
    python benchmarks/speed.py --case search_step --images <cifar10>/train [--rows 1,3 --batch 64]
    python benchmarks/speed.py --case retrain_step --rows 1024:fp16:cl
    python benchmarks/speed.py --case roofline         # the retrain step's least bytes per kernel class against HBM
    python benchmarks/speed.py --case bptt_step        # the binary SNN's BPTT fine-tuning step beside the QANN step
    python benchmarks/speed.py --case snn_eval [--data <cifar10>]   # the binary SNN's accuracy at T = 1 ... 16
    python benchmarks/speed.py --case depthwise        # the depthwise convs' forward + backward, cuDNN's and ours
    python benchmarks/speed.py --case peers --darts-dir .peers/darts/cnn --pc-darts-dir .peers/PC-DARTS
    python benchmarks/speed.py --case search_scaling --gpus 1,4 data.root=<cifar10>
    python benchmarks/speed.py --case retrain_scaling --gpus 1,2,4 data.root=<cifar10>
    python benchmarks/speed.py --case search_step --tiny      # CPU smoke run of the case, no rows written

Arguments after --case go to the case (``--help`` after it lists them). The cases but the scaling ones are each
benchmarks/speed_<case>.py; they need a GPU (all but st_bif take ``--tiny``, a smoke run on a CPU that writes no
rows) and write to benchmarks/results/speed.csv. SIGTERM (``timeout``) stops a case like Ctrl-C; bptt_step and
snn_eval then write the rows they timed so far. The scaling cases run search.py or train.py under torchrun on 1, then
more GPUs of this machine (same batch per GPU, so N GPUs take N times fewer steps) and write the median epoch's
images/s and the speed-up over the first count to scaling.csv.
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
import signal
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.rows import REPO, RESULTS, Measurement, append_rows, print_measurements
from search_space.errors import UserInputError

DEFAULT_ROWS = {"st_bif": "speed.csv", "search_step": "speed.csv", "retrain_step": "speed.csv", "roofline": "speed.csv",
                "bptt_step": "speed.csv", "snn_eval": "speed.csv", "peers": "speed.csv", "depthwise": "speed.csv",
                "search_scaling": "scaling.csv", "retrain_scaling": "scaling.csv"}
# The scaling cases: the full QANN search cut to 1 warm-up and 5 search epochs; the full-size retrain cut to 8 epochs.
SEARCH = ("search.py", "experiment=cifar10_qann", "search.schedule.cycles=1", "search.schedule.warmup_epochs=1",
          "search.schedule.search_epochs=5", "search.schedule.restabilize_epochs=0", "logger=none")
RETRAIN = ("train.py", "experiment=cifar10_qann_fast", "genotype=DARTS_V2", "batch_size=256", "epochs=8",
           "snn_max_timesteps=8", "data.max_test_samples=1000", "logger=none")
SEARCH_EPOCH = re.compile(r"cycle \d+ search \(epoch (\d+)\).*images_per_second ([\d.e+]+)")


def epoch_rates(run_dir: Path, script: str) -> list[float]:
    """Images/s of each epoch after the first (which compiles and captures)."""
    if script == "train.py":
        history = json.loads((run_dir / "metrics.json").read_text())["history"]
        return [epoch["images_per_second"] for epoch in history][1:]
    return [float(rate) for _, rate in SEARCH_EPOCH.findall((run_dir / "search.log").read_text())][1:]


def scaling(case: str, argv: Sequence[str]) -> list[Measurement]:
    parser = argparse.ArgumentParser(prog=f"speed.py --case {case}")
    parser.add_argument("--gpus", default="1,4", help="comma-separated GPU counts, the first the baseline")
    parser.add_argument("--work", type=Path, default=Path("outputs/scaling"), help="run dirs go here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. data.root=<cifar10>")
    args = parser.parse_args(argv)
    script, *fixed = SEARCH if case == "search_scaling" else RETRAIN
    counts = [int(count) for count in args.gpus.split(",")]
    medians = {}
    for count in counts:
        run_dir = (args.work / f"{case}_{count}gpu").resolve()
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={count}", script,
                  "trainer=ddp"]
        command = [*launch, *fixed, *args.overrides, f"hydra.run.dir={run_dir}"]
        print("$", " ".join(command[1:]), flush=True)
        subprocess.run(command, cwd=REPO, check=True)
        medians[count] = statistics.median(epoch_rates(run_dir, script))
    what = "QANN search epoch" if case == "search_scaling" else "full-size retrain epoch (batch 256 per GPU)"
    rows = [Measurement(case, f"{what}, {count} GPU{'s' * (count > 1)}: throughput", round(rate), "images/s",
                        "median of the epochs after the first") for count, rate in medians.items()]
    base = counts[0]
    rows += [Measurement(case, f"{what}, {count} GPUs / {base}", round(medians[count] / medians[base], 2), "x")
             for count in counts[1:]]
    return rows


def run_case(case: str, argv: Sequence[str]) -> list[Measurement]:
    if case in ("search_scaling", "retrain_scaling"):
        return scaling(case, argv)
    module = importlib.import_module(f"benchmarks.speed_{case}")  # each case in its own module
    return module.main(argv)


def stop_on_sigterm() -> None:
    """SIGTERM (``timeout``, a scheduler) raises KeyboardInterrupt like Ctrl-C: the cases that time row by row
    (bptt_step, snn_eval) catch it and return the rows they have, which are then written. LLVM inside libtriton
    installs a killing SIGTERM handler when Triton first compiles a kernel (aso_se.run.stop_signals): ours goes
    back after every kernel load."""
    from triton import knobs as triton_knobs

    signal.signal(signal.SIGTERM, _stop)
    triton_knobs.runtime.kernel_load_end_hook.add(put_back_sigterm)


def _stop(signum, frame):
    raise KeyboardInterrupt


def put_back_sigterm(*args) -> None:
    if threading.current_thread() is threading.main_thread():  # signal.signal's rule
        signal.signal(signal.SIGTERM, _stop)  # sigaction() again, whatever Python believes is installed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False, add_help=False)
    parser.add_argument("--case", required=True, choices=tuple(DEFAULT_ROWS))
    parser.add_argument("--rows-out", default=None,
                        help="the rows file (default: the case's in benchmarks/results/; '' writes none)")
    args, rest = parser.parse_known_args(argv)
    try:
        measurements = run_case(args.case, rest)
    except UserInputError as error:
        print(f"speed.py --case {args.case}: {error}", file=sys.stderr)
        return 2
    print_measurements(measurements)
    if args.rows_out is None:  # a --tiny smoke run measures nothing worth keeping
        rows_out = "" if "--tiny" in rest else RESULTS / DEFAULT_ROWS[args.case]
    else:
        rows_out = args.rows_out
    if rows_out and measurements:
        print(f"{append_rows(Path(rows_out), measurements)} rows appended to {rows_out}")
    return 0


if __name__ == "__main__":
    stop_on_sigterm()
    sys.exit(main())
