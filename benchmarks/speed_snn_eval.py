"""Speed case snn_eval: the wall time of the binary SNN's test accuracy at T = 1 … 16, as train.py evaluates it.

    python benchmarks/speed.py --case snn_eval                       # DARTS_V2_SPIKE_NATIVE 20×36, 10,000 random images
    python benchmarks/speed.py --case snn_eval --data /tmp/cifar10   # CIFAR-10's test images instead
    python benchmarks/speed.py --case snn_eval --tiny                # CPU smoke run of the case itself (no rows)

Why: every QANN retrain ends with its exact SNN's evaluation, and a fine-tuning with the fine-tuned SNN's; both run
the network up to 16 times per test image, in fp32 without TF32, and issue 98 asks that they take seconds, not
minutes. The functions timed are the ones train.py calls:

- ``converted``: aso_se.train.snn_eval.snn_metrics, the QANN stage's (the QANN over the set, then one run of its
  binary SNN read after 1, 2, 4, 6, 8 and 16 steps), with snn_max_timesteps = snn_first_timesteps = ``--max-timesteps``
  so that it makes that one run and no longer one;
- ``finetuned``: search_space.trainable_snn.accuracy_against_timesteps on the QANN's trainable SNN at
  T = snn_finetune.timesteps, the fine-tuning stage's (finetuned_metrics), read after every T from 1 to
  ``--max-timesteps`` (one run).

The QANN (a level-``--level`` ``st_bif_qann`` network, as experiment=cifar10_binary_snn trains) has random weights: the
time is what is measured (dense convs and the neuron's kernel cost the same whatever the weights), and the accuracy
means nothing. Its batch norms take their statistics from two batches first, so that activations keep a trained
network's scale. Each function runs once on the first batch (kernel compilation, cuDNN's choices), then is timed over
all the images, already in host memory in batches of ``--batch`` (train.py's test loader): the host's wall clock,
synced, including the copy to the GPU. Beside it, the floor: the evaluation's least bytes (the QANN's forward and the
SNN's at the cap, by benchmarks/speed_roofline.py's rules) at the GPU's HBM bandwidth, and the share of it reached.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: the repository on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aso_se.data import CIFARData
from aso_se.train.snn_eval import snn_metrics
from benchmarks import speed_roofline
from benchmarks.rows import Measurement
from benchmarks.speed_retrain_step import sync
from search_space.errors import UserInputError
from search_space.network import build_network
from search_space.neurons import NeuronFactory
from search_space.qann import convert_to_snn
from search_space.trainable_snn import accuracy_against_timesteps, trainable_snn

FUNCTIONS = ("converted", "finetuned")
# The fine-tuned SNN's own T (snn_finetune.timesteps of experiment=cifar10_binary_snn): where it is trained, not how
# far it is read.
FINETUNE_TIMESTEPS = 4
# Batches in train mode that set the random network's batch-norm statistics.
STATISTICS_BATCHES = 2


def test_batches(args) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], str]:
    """The images to evaluate, in host memory and in batches as train.py's test loader makes them, and their name."""
    if args.data:
        data = CIFARData(name="cifar10", root=args.data, download=False, num_workers=args.workers,
                         max_test_samples=args.images)
        _, test = data.train_loaders(args.batch, seed=0)
        test.set_epoch(0)
        return list(test), "CIFAR-10 test images"
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(args.images, 3, 32, 32, generator=generator)
    labels = torch.randint(10, (args.images,), generator=generator)
    return list(zip(images.split(args.batch), labels.split(args.batch))), "random images"


def random_qann(genotype: str, args, batches, device) -> torch.nn.Module:
    """The QANN of ``genotype`` with random weights (seed 0), its batch-norm statistics from the first batches."""
    torch.manual_seed(0)
    qann = build_network(genotype, neuron=NeuronFactory("st_bif_qann", timesteps=1, level=args.level),
                         channels=args.channels, layers=args.layers, num_classes=10, auxiliary=True,
                         conv_backend="torch").to(device)
    for module in qann.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.momentum = None  # a cumulative average over the batches below
    qann.train()
    with torch.no_grad():
        for images, _ in batches[:STATISTICS_BATCHES]:
            qann(images.to(device))
    return qann.eval()


def evaluated_network(function: str, qann):
    """What the function evaluates: the QANN itself (converted inside), or the trainable SNN fine-tuning trains."""
    return qann if function == "converted" else trainable_snn(qann, FINETUNE_TIMESTEPS)


def run_function(function: str, network, batches, device, max_timesteps: int) -> dict[int, float]:
    """One evaluation as train.py runs it; the accuracy after each step it reads."""
    if function == "converted":
        metrics = snn_metrics(network, batches, device=device, max_timesteps=max_timesteps,
                              first_timesteps=max_timesteps)
        return {int(steps): accuracy for steps, accuracy in metrics["snn_acc_at_t"].items()}
    result = accuracy_against_timesteps(network, batches, device=device, timesteps=range(1, max_timesteps + 1))
    return result.accuracy_at


def time_function(function: str, qann, batches, device, max_timesteps: int) -> tuple[float, dict[int, float]]:
    """Seconds of one evaluation over all ``batches`` (after one on the first batch), and its accuracies."""
    started = time.perf_counter()
    network = evaluated_network(function, qann)
    run_function(function, network, batches[:1], device, max_timesteps)  # compiles, picks cuDNN's algorithms
    sync(device)
    # untimed, but said: a stopped case then shows where its time went
    print(f"({function}: built and warmed up on one batch in {time.perf_counter() - started:.1f} s)", flush=True)
    started = time.perf_counter()
    accuracy = run_function(function, network, batches, device, max_timesteps)
    sync(device)
    return time.perf_counter() - started, accuracy


def least_bytes(function: str, qann, image: torch.Tensor, images: int, max_timesteps: int) -> int:
    """The least bytes of one evaluation of ``images`` by speed_roofline's forward rules (each layer reads its input
    and weights and writes its output once; batch norms folded into their convs, so none): the SNN's forward at
    T = ``max_timesteps`` and, for ``converted``, the QANN's forward before it; from a recorded forward of ``image``
    (one batch of 2, the evaluation's dtype)."""
    snn = convert_to_snn(qann, max_timesteps)
    networks = [qann, snn] if function == "converted" else [snn]
    total = 0
    with torch.no_grad():
        for network in networks:
            calls = speed_roofline.record_step(network, lambda network=network: network(image))
            total += sum(speed_roofline.call_bytes(call)[0] for call in calls)
    return total * images // len(image)


def names(text: str) -> list[str]:
    chosen = [part for part in text.split(",") if part]
    unknown = [part for part in chosen if part not in FUNCTIONS]
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: pass a comma-separated choice of {', '.join(FUNCTIONS)}")
    return chosen


def main(argv: list[str] | None = None) -> list[Measurement]:
    parser = argparse.ArgumentParser(prog="speed.py --case snn_eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--genotypes", default="DARTS_V2_SPIKE_NATIVE", help="comma-separated")
    parser.add_argument("--functions", type=names, default=list(FUNCTIONS),
                        help="converted (snn_metrics), finetuned (accuracy_against_timesteps), or both")
    parser.add_argument("--data", help="CIFAR-10 root (torchvision's files or the JPEG tree); default: random images")
    parser.add_argument("--images", type=int, default=10_000, help="test images (a stratified subset of CIFAR-10's)")
    parser.add_argument("--batch", type=int, default=256, help="the test loader's batch (train.py's batch_size)")
    parser.add_argument("--max-timesteps", type=int, default=16, help="the accuracy is read at T = 1 … this")
    parser.add_argument("--level", type=int, default=4, help="the QANN's quantization levels (neuron.level)")
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--channels", type=int, default=36)
    parser.add_argument("--workers", type=int, default=8, help="loader workers decoding --data")
    parser.add_argument("--hbm-gbps", type=float, help="the GPU's HBM bandwidth (default: by its name)")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: 3 cells × 4 channels, 24 images")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        args.layers, args.channels, args.images, args.batch, args.workers = 3, 4, 24, 8, 0
    for option, value in (("--images", args.images), ("--batch", args.batch), ("--max-timesteps", args.max_timesteps)):
        if value < 1:
            raise UserInputError(f"{option} {value}: pass a positive integer")
    if device.type != "cuda" and not args.tiny:
        raise UserInputError("snn_eval times a GPU's evaluation: run it with CUDA, or pass --tiny (a CPU smoke run)")
    torch.backends.cudnn.benchmark = True
    started = time.perf_counter()
    batches, images_name = test_batches(args)
    loaded = time.perf_counter() - started
    count = sum(len(labels) for _, labels in batches)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{datetime.date.today()} {gpu}, torch {torch.__version__}; {args.layers}×{args.channels}, level "
          f"{args.level}, {count:,} {images_name} in batches of {args.batch} (loaded in {loaded:.1f} s), "
          f"T = 1 … {args.max_timesteps}", flush=True)
    gbps = speed_roofline.hbm_gbps(gpu, args.hbm_gbps) if device.type == "cuda" else speed_roofline.CPU_SMOKE_GBPS
    print(f"HBM {gbps:,.0f} GB/s; floor: the least bytes at HBM bandwidth (benchmarks/speed_roofline.py's rules)")
    print("| genotype | function | wall (s) | images/s | floor (s) | share of HBM | accuracy at T = 1, max "
          "(random weights) |\n|---|---|---:|---:|---:|---:|---|")
    measured: list[Measurement] = []  # filled as each function is timed: a stopped case keeps what it has
    try:
        for genotype in [part for part in args.genotypes.split(",") if part]:
            qann = random_qann(genotype, args, batches, device)
            for function in args.functions:
                seconds, accuracy = time_function(function, qann, batches, device, args.max_timesteps)
                least = least_bytes(function, qann, batches[0][0][:2].to(device), count, args.max_timesteps)
                floor, share = least / (gbps * 1e9), 100 * least / (gbps * 1e9) / seconds
                print(f"| {genotype} | {function} | {seconds:.1f} | {count / seconds:,.0f} | {floor:.2f} | "
                      f"{share:.1f}% | {100 * accuracy[1]:.1f}%, {100 * accuracy[args.max_timesteps]:.1f}% |",
                      flush=True)
                what = (f"{genotype} {args.layers}×{args.channels} level-{args.level} binary SNN, {function} "
                        f"({'snn_metrics' if function == 'converted' else 'accuracy_against_timesteps'}), accuracy at "
                        f"T = 1 … {args.max_timesteps} on {count:,} images")
                note = f"random weights (timing only); {images_name}; after a warm-up call on one batch"
                measured.append(Measurement("snn_eval", f"{what}: wall", round(seconds, 2), "s", note))
                if device.type == "cuda":  # a CPU smoke run has no HBM to share
                    measured.append(Measurement("snn_eval", f"{what}: least bytes at HBM bandwidth", round(floor, 2),
                                                "s", f"HBM {gbps:,.0f} GB/s; {least / 1e9:,.0f} GB"))
                    measured.append(Measurement("snn_eval", f"{what}: share of HBM bandwidth", round(share, 1), "%",
                                                "the floor's time over the wall time"))
            del qann
    except KeyboardInterrupt:
        print(f"stopped after {len(measured)} rows: keeping them", file=sys.stderr)
    return measured
